"""fairgate webhook: the imperative shell around the pure admission logic.

- :mod:`webhook.app`: ``create_app(service)``, the FastAPI app (``/mutate``,
  ``/validate``, ``/healthz``, ``/readyz``, ``/metrics``): HTTP, limits, deadline.
- :mod:`webhook.service`: ``AdmissionService``, the decisions (plan, queue, patch,
  validation, ConfigMap edits), audited.
- :mod:`webhook.checker`: ConfigMap checks in a worker process, under a time budget.
- :mod:`webhook.server`: ``fairgate serve`` (uvicorn over TLS 1.2+, hot reloads).
- :mod:`webhook.dispatch`: ``fairgate dispatch`` (dispatcher against a real cluster).
- :mod:`webhook.cli`: the ``fairgate`` command; :mod:`webhook.demo`: ``fairgate demo``.
- :mod:`webhook.process`: ``fairgate serve`` as a child process (demo, tests, bench).
- :mod:`webhook.child`: the command line of any child process fairgate starts.
"""
