"""An OpenAI-compatible load generator: closed loop (fixed concurrency) or open loop (Poisson or a trace),
streamed or not, over deterministic workloads (short chat, long-context RAG, multi-turn shared-prefix chat,
a mix). Measures TTFT, inter-token latency, end-to-end latency, throughput and errors.

    vocab = load_vocab(default_model_dir() / "tokenizer.json")
    target = OpenAITarget("http://127.0.0.1:8080", "llama3-default")
    prepared = prepare_all(target, Workload("chat").specs(vocab, 1000))
    result = await closed_loop(target, prepared, concurrency=8)
    print(result.summary())

`python -m load.loadgen --help` runs the same from the command line.
"""

from load.loadgen.openai_target import OpenAITarget
from load.loadgen.records import Record, json_safe, summarize
from load.loadgen.runner import (
    RunResult,
    Target,
    closed_loop,
    load_trace,
    open_loop,
    poisson_arrivals,
    prepare_all,
)
from load.loadgen.text import Text, Vocab, load_vocab
from load.loadgen.workloads import WORKLOADS, ChatSpec, Message, Workload

__all__ = [
    "WORKLOADS",
    "ChatSpec",
    "Message",
    "OpenAITarget",
    "Record",
    "RunResult",
    "Target",
    "Text",
    "Vocab",
    "Workload",
    "closed_loop",
    "json_safe",
    "load_trace",
    "load_vocab",
    "open_loop",
    "poisson_arrivals",
    "prepare_all",
    "summarize",
]
