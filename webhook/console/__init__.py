"""``fairgate console``: a live web view of tenants, queue, fairness, audit and cost.

Modules: :mod:`.data` (what each page shows, as JSON-ready data, always filtered to what
the viewer may see), :mod:`.history` (fairness samples in bounded Redis streams),
:mod:`.access` (local token or Kubernetes TokenReview + SubjectAccessReview),
:mod:`.events` (one shared producer fanning audit records out to SSE clients),
:mod:`.app` (the Starlette app: pages, ``/api/``, ``/api/events``) and :mod:`.run`
(the command). Pages and API: ``docs/console.md``.
"""
