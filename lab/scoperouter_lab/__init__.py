"""`scoperouter lab`: real OpenStack clouds on loopback, each fronted by a scoperouter.

Entry points: :func:`scoperouter_lab.cli.register` (the ``lab`` subcommand) and
:class:`scoperouter_lab.lab.Lab` (``up``, ``status``, ``down``). See ``layout`` for the address
plan and ``templates`` for the service configuration.
"""
