"""Hosting: the shards one process holds, each entity's activation, applying messages,
runs and their steps, sends (outbox), hand-offs between hosts, and `LocalBackend`, the
backend that serves a `Runtime`'s requests from this process.

The same code runs in a plain process and inside a Ray host actor; it never imports
`corral.runtime.ray` (a layering test keeps it so). A step given `ray_options` runs as a
Ray task through `_step_tasks`, on any backend: that is Ray the library, not the Ray
backend.
"""
