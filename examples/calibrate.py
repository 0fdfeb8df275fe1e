"""Calibration: pick an ensemble's member weights on held-out problems, not on the reported ones.

`Calibration` is the Python side of `ensemble-llm calibrate`: it runs each candidate weighting
of one configuration on a slice of a task that the evaluation does not report on (an overlap
is refused) and keeps the most accurate, ties going to the cheaper. Here GaC over
Qwen2.5-Coder 0.5B + SmolLM2 135M tries two weightings (equal, and Qwen at 0.9) on two
problems of a second arithmetic set (seed 1; the evaluation reports on seed 0). Leave
`weights=` out to try them all (equal, the "prompt" and "agreement" rules, each member leading
at 0.5 / 0.7 / 0.9); real calibrations use a few dozen problems. The command line also writes
the choice into a copy of the YAML config:
`ensemble-llm calibrate --config CONFIG --configuration NAME --task arithmetic:raw:seed1@0-23`.

Needs the eval extra: `pip install "ensemble-llm[eval]"` (`make demo` installs it).
Run: `python examples/calibrate.py` (after `make demo` has prepared the models).
"""

import os
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import yaml

from ensemble_core.eval import Calibration, TaskSpec, build_config

config = build_config(
    {
        "tasks": [{"task": "arithmetic", "style": "raw", "seed": 0, "problems": 50}],  # what is reported
        "configurations": [{"members": ["qwen", "smol"], "method": "gac"}],
    }
)
held_out = TaskSpec(task="arithmetic", style="raw", seed=1, problems=2, max_new_tokens=40)
with tempfile.TemporaryDirectory() as folder:
    calibration = Calibration(
        config, "gac(qwen+smol)", held_out, Path(folder), quiet=True, weights=["equal", "qwen:0.9"]
    )
    chosen, rows = calibration.run()
for row in rows:
    print(f"{row.config}: {row.correct}/{row.total} right, {row.ms_per_token:.0f} ms/token")
print(f"chosen: {chosen.label()}, weights {chosen.weights or 'equal'}")
line = yaml.safe_dump(chosen.model_dump(exclude_defaults=True), default_flow_style=True, sort_keys=False)
print(f"as a line of the config's configurations: - {line.strip()}")
