"""The benchmark command: this project next to upstream SGLang, measured side by side in one run.

    python scripts/benchmark.py [--quick] [--rounds 3] [--duration 2] [--no-write]

Prints one table per measurement and writes ``docs/benchmark-results.md`` (with this machine's
cores and CPU model, and the command line). Every figure for this project has its baseline
measured in the same run, interleaved round by round, so the ratios are what to read: absolute
numbers move with whatever else the machine is doing. The conclusions under the tables are
generated from the figures of the run.

1. GetServerInfo on loopback (1/16/64 concurrent clients, 20 KB and 1 MiB snapshots):
   ``_native.start_metadata_server`` vs upstream's ``start_metadata_server`` (the ``_grpc``
   extension of the newest release's sglang wheel, loaded on its own) vs a grpcio server
   returning the same pre-encoded bytes. Load comes from ``rust/bench-client`` (built here
   with cargo).
2. Idle resident memory and threads of each server process (measured with row 1).
3. Time from the ``start_metadata_server`` call to the first successful GetServerInfo.
4. The sidecar supervisor vs SGLang's ``Sidecar``/``SubprocessWatchdog`` (``bench_sidecar.py``),
   which needs a Python with SGLang installed (``--sglang-python``, or the cached env that
   ``scripts/sglang_envs.py`` built). Without one the row is reported as not measured.
5. Plugin cost: ``load_plugins()`` in a fresh process with and without this plugin allowed, and
   the leader's launch step, on stock SGLang and on the rebuilt wheel (patch 0006).
6. The shape of our GetServerInfo service: the hand-framed tower service (``ours``) vs tonic's
   generated server returning the pre-encoded message (``ours-generated``), same load as row 1.
7. Leader ``GetServerInfo`` per call on 0.5.22+: SGLang's real ``RuntimeHandle.get_server_info``
   with the overlay's builder hook, rebuilt on every call (the path before the reply was
   cached) vs the overlay's cached text, alternating in one process of the SGLang env.
8. Serving cost on SGLang's real schedulers: one leader node (``test-registered``'s harness,
   the CPU test platform, the tiny model) with this plugin allowed vs stock, one launch at a
   time in interleaved rounds (``--serving-rounds``), beside a noise floor measured the same
   way with both sides stock: launch to ready, a fixed streamed ``/generate`` workload
   (``--serving-requests``; throughput, latency, time to first token), the delay from a
   request's first token to its KV-event batch, the node's CPU time, and the engine's and
   schedulers' RSS. A launch that other processes disturbed is run again (a bounded number
   of times).

``--service-shape`` runs only row 6, ``--plugin-cost`` only row 5, ``--leader-info`` only
row 7 and ``--serving`` only row 8, and print it (nothing written).

``--smoke`` (``make test``) runs every row once: tiny durations, one client per load point,
every supervisor measurement of ours but only upstream's spawn (each upstream sidecar child
imports SGLang), the plugin row without the engine pre-imports (its figures mean nothing
there), one launch per side of the serving row with a few requests and no noise floor (about
a minute of the run), nothing written; exit 1 if a row failed.

One module per row (``load`` holds rows 1 and 2, which one measurement produces); the rows
that run inside SGLang (4, 5, 7, 8) take the SGLang environment as a parameter
(``common.SglangEnv``), and the programs they run there are modules of this package
(``plugin_load``, ``leader_reply``, ``serving_launch``), as are the server and first-call
children (``serve``, ``first_call``).
Downloads go to the scripts' cache (``$SGLANG_OVERLAY_CACHE/bench``).
"""
