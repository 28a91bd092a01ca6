"""`scoperouter lab`: real OpenStack clouds on loopback, each fronted by a scoperouter.

Entry points: :func:`scoperouter.lab.cli.register` (the ``lab`` subcommand) and
:class:`scoperouter.lab.lab.Lab` (``up``, ``status``, ``down``). See ``layout`` for the address
plan and ``templates`` for the service configuration.
"""
