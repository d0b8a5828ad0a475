"""The client: what callers use (`Runtime`, `EntityRef`, `signal_many`), the checks at the
boundary, the request records and answers, and the seam every backend implements
(`_backend.Backend`).

It imports neither `host` nor `ray` (a layering test keeps it so): a `Runtime` is handed
its backend by `corral.runtime._open.open_runtime`.
"""
