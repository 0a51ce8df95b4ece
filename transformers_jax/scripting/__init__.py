"""What the scripts and experiment drivers share: sweeps over presets (sweeps), compile tables
(bench_report) and the output paths a script checks before its work (output_paths)."""
