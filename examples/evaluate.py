"""Does the ensemble beat its members? The evaluation's Python API on two arithmetic problems.

The same data as a YAML config (`ensemble-llm eval --config examples/eval.yaml`): tasks,
configurations (`method: single` over several members means each member alone), an output
folder. `Evaluation.run()` generates what the folder's `records.jsonl` lacks (so a run cut
short resumes) and `write_report` writes `report.md` beside it: accuracy with a confidence
interval, each ensemble against its best member on the same problems, cost per token.
Here the folder is a temporary one, and two problems say nothing yet about accuracy: see
`examples/eval.yaml` and the published reports in docs/results/ for real sizes.

Needs the eval extra: `pip install "ensemble-llm[eval]"` (`make demo` installs it).
Run: `python examples/evaluate.py` (after `make demo` has prepared the models).
"""

import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from ensemble_core.eval import Evaluation, build_config, write_report

with tempfile.TemporaryDirectory() as folder:
    config = build_config(
        {
            "output": folder,
            "tasks": [{"task": "arithmetic", "style": "raw", "seed": 0, "problems": 2, "max_new_tokens": 40}],
            "configurations": [
                {"members": ["qwen", "smol"], "method": "single"},  # each member alone
                {"members": ["qwen", "smol"], "method": "gac", "weights": "auto"},
            ],
        }
    )  # aliases: qwen = qwen2.5-coder-0.5b-instruct, smol = smollm2-135m-instruct (`members:` to change)
    records = Evaluation(config, quiet=True).run()
    for record in records:
        print(f"{record.config} | {record.item}: {'right' if record.correct else 'wrong'} | {record.reply.strip()!r}")
    report = write_report(config, records, "python examples/evaluate.py", plots=False)
    print(report.read_text())
