"""The machine a run computes on: chips' data sheets (hardware), the device mesh and its
sharding rules (parallel), joining a multi-process run (cluster_join), a one-node cluster for
tests and benchmarks (local_cluster) and the persistent compilation cache (compile_cache)."""
