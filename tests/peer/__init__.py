"""The peer-suite runner: OpenStack's own tests against the lab, three ways.

openstacksdk ships ``openstack/tests/functional`` and python-openstackclient ships
``openstackclient/tests/functional``; Tempest ships its API tests. This package runs a selection
of them (identity, image, compute, placement, and object store, orchestration and block storage
when the lab runs swift, heat and cinder: ``selection.py``; Tempest's from the refstack interop
guideline's list, ``tempest-interop.txt``) from the versions installed beside scoperouter
against the lab's CloudOne:

(a) ``direct``: every request of the suites straight to the services (keystone on 127.0.1.2 and
    an endpoint override per service type, or Tempest's base URLs moved there: the backends);
(b) ``router``: through CloudOne's router, as the keystone catalog advertises, no scope;
(c) ``scoped``: through the router with every request scoped ``{"image": "CloudTwo"}`` (the
    clouds.yaml ``scope:`` key and scoperouter's openstacksdk ``vendor_hook``; for Tempest a
    hook on its auth provider, ``tempest_hook.py``: no test is changed).

It prints the number of tests run in each mode and suite, the differences test by test, and
exits 1 when a test passes in (a) and fails, is skipped or is missing in (b) or (c).
``python -m tests.peer --help`` from the repository's root.
"""
