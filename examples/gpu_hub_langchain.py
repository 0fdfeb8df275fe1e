"""Two Hub models on a GPU in a LangChain chain: Qwen2.5-1.5B-Instruct + SmolLM2-1.7B-Instruct.

Needs: the Hugging Face Hub (the first run downloads about 7 GB) and a CUDA GPU with about 8 GB
free. The test suite does not run it (it only compiles it and runs its imports).

Two tokenizer families write each reply together, token by token; the chain is LangChain's own
(`prompt | llm | parser`), so any other chat model could take the ensemble's place.

Run: `pip install "ensemble-llm[langchain]"` (with a CUDA build of torch), then
`python examples/gpu_hub_langchain.py`.
"""

from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate

from langchain_ensemble import ChatEnsemble

llm = ChatEnsemble(
    models=["Qwen/Qwen2.5-1.5B-Instruct", "HuggingFaceTB/SmolLM2-1.7B-Instruct"],
    device="cuda", dtype="bfloat16",   # GaC with weights="auto": the adapters' default
    max_tokens=128,
)  # fmt: skip
prompt = ChatPromptTemplate.from_messages([("system", "You are a concise assistant."), ("human", "{question}")])
chain = prompt | llm | StrOutputParser()

for piece in chain.stream({"question": "Name three prime numbers and say why each one is prime."}):
    print(piece, end="", flush=True)
print()
