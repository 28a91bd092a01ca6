"""``ansible`` services: an operator adds a service as a directory (a *pack*) without Python.

A pack is ``service.yml`` (the offering: name, description, plans, the JSON schemas of the
parameters per action, bindable, placement) and one playbook per action (``provision.yml``,
``update.yml``, ``deprovision.yml``, ``bind.yml``, ``unbind.yml``). The broker runs them with
ansible-runner against ``localhost`` (connection local, the broker's own Python, so the
``openstack.cloud`` collection's modules use the broker's openstacksdk), each run given a
clouds.yaml (``OS_CLOUD=osb``) holding a token scoped to the instance's project in the chosen
cloud, through that cloud's router, with the routing scope when there is one. Results a playbook
publishes with ``set_stats`` become the instance's metadata (provision, update) and the
binding's credentials (bind). docs/broker/ansible-packs.md is the pack author's guide.

- :mod:`.pack`: ``service.yml`` (pydantic), the catalog entry it makes.
- :mod:`.playbook`: one ansible-runner run: private data directory, environment, the launcher
  that ties the run to the broker's life, events, ``set_stats``, scrubbing, reaping.
- :mod:`.service`: the :class:`~scoperouter.broker.services.base.Service` that runs a pack.
"""
