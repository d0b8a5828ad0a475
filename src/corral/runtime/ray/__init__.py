"""The Ray backend: a deployment's declared release (`_release`) and what starts, rolls
and stops it (`_deployment`), the client's connection (`_connection.RayBackend`), the
named host actors that wrap the host's shards (`_shard_host`), where shards live
(`_directory`, `_placer`), nodes (`_cluster_nodes`), the actors' environment, logs and
metrics.

It may import `client` and `host`; neither imports it.
"""
