"""The peer-suite runner: OpenStack's own functional tests against the lab, three ways.

openstacksdk ships ``openstack/tests/functional`` and python-openstackclient ships
``openstackclient/tests/functional``; this package runs a selection of them (identity, image,
compute, placement: ``selection.py``) from the versions installed beside scoperouter against the
lab's CloudOne:

(a) ``direct``: every request of the suites straight to the services (keystone on 127.0.1.2 and
    an endpoint override per service type: the backends);
(b) ``router``: through CloudOne's router, as the keystone catalog advertises, no scope;
(c) ``scoped``: through the router with every request scoped ``{"image": "CloudTwo"}`` (the
    clouds.yaml ``scope:`` key and scoperouter's openstacksdk ``vendor_hook``: no test is
    changed).

It prints the number of tests run in each mode, the differences test by test, and exits 1 when
a test passes in (a) and fails in (b) or (c). ``python -m tests.peer --help`` from the
repository's root.
"""
