"""What the scripts and experiment drivers share: sweeps over presets (sweeps), compile tables
(bench_report), the output paths a script checks before its work (output_paths) and the
checks of our models against transformers on random configs (hf_check)."""
