"""Retrieval-augmented generation with LangChain on a two-model ensemble, fully offline.

Documents are embedded with all-MiniLM-L6-v2 (a PyPI package, no network), kept in
LangChain's in-memory vector store, and the retrieved passages are put into the prompt of
a `ChatEnsemble` (Qwen2.5-Coder 0.5B + SmolLM2 135M under SAFE).

Run: `python examples/langchain_rag.py` (after `make demo` has set everything up).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from langchain_core.documents import Document
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import Runnable, RunnablePassthrough
from langchain_core.vectorstores import InMemoryVectorStore
from offline_embeddings import langchain_embeddings
from transformers.utils import logging as hf_logging

from langchain_ensemble import ChatEnsemble

MODELS = ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"]
DOCUMENTS = [
    "The Zephyr-9 drone has a flight time of 42 minutes and weighs 1.3 kg.",
    "The Zephyr-9 drone charges fully in 55 minutes with the supplied 65 W charger.",
    "Harbor Cafe opens at 7 am on weekdays and serves oat-milk cortados.",
    "The city library lends telescopes for two weeks with a library card.",
    "Python's `enumerate` yields pairs of an index and an item.",
]
PROMPT = ChatPromptTemplate.from_messages(
    [
        ("system", "Answer the question using only this context:\n{context}"),
        ("human", "{question}"),
    ]
)


def build_chain(llm: ChatEnsemble, documents: list[str] = DOCUMENTS, k: int = 2) -> Runnable:
    """question -> retrieve k passages -> prompt -> ensemble -> text."""
    store = InMemoryVectorStore(langchain_embeddings())
    store.add_documents([Document(page_content=text) for text in documents])
    retriever = store.as_retriever(search_kwargs={"k": k})

    def join(docs: list[Document]) -> str:
        return "\n".join(f"- {d.page_content}" for d in docs)

    return {"context": retriever | join, "question": RunnablePassthrough()} | PROMPT | llm | StrOutputParser()


def main() -> None:
    hf_logging.disable_progress_bar()
    llm = ChatEnsemble(models=MODELS, method="safe", method_params={"drafter": "qwen"}, max_tokens=48)
    chain = build_chain(llm)
    for question in ("How long can the Zephyr-9 fly?", "When does Harbor Cafe open?"):
        print(f"Q: {question}\nA: ", end="")
        for piece in chain.stream(question):
            print(piece, end="", flush=True)
        print()


if __name__ == "__main__":
    main()
