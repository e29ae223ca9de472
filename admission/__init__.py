"""fairgate admission: pure decisions about pods (plain JSON in, plain data out; no I/O).

- :mod:`admission.reviews`: AdmissionReview v1 request models and response builders.
- :mod:`admission.quantity`: Kubernetes quantity strings as exact numbers.
- :mod:`admission.pods`: a pod parsed once into the typed, immutable ``PodView`` every
  rule below reads.
- :mod:`admission.demand`: a pod's GPU demand (effective-request rule).
- :mod:`admission.classes`: a pod's class (label, tenant default, owner kind).
- :mod:`admission.plan`: ``plan_create`` -> NotOurs | Denied | PodPlan.
- :mod:`admission.mutation`: the JSON Patch that stamps a planned pod.
- :mod:`admission.validation`: verdicts for pod CREATE and UPDATE.
"""
