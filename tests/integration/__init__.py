"""Integration tests: real scoperouter processes on loopback in front of echo backends."""
