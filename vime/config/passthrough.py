"""``--vllm-<server-flag> [VALUE ...]``: vLLM server flags passed through to every `vllm serve` vime starts.

vLLM's own flags are not declared in vime's parser: vime's base install (the simulator) has no
vLLM to ask for them, and copying their list would go stale with every vLLM release. So the
words are taken out of the command line before argparse sees it (`split_vllm_args`): a word
``--vllm-NAME`` that is not one of vime's own flags (``--vllm-server-concurrency`` is) becomes
``--NAME`` on the server's command line, with the words after it up to the next ``--`` word as
its values. `check_vllm_args` refuses the flags vime sets itself, naming vime's flag for it.
vLLM rejects a flag it does not know when the server starts, with its own message in the log.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from vime.errors import ConfigError

PREFIX = "--vllm-"
_NAME = re.compile(r"^--[a-z0-9][a-z0-9-]*$")

#: vLLM flags vime writes on the server's command line (vime.real.vllm.launcher.server_command) or
#: must control, and what to use instead.
RESERVED: dict[str, str] = {
    "--model": "--hf-checkpoint",
    "--host": "leave it out: vime listens on loopback, or on the node's address in a Ray cluster",
    "--port": "leave it out: vime picks a free port per engine",
    "--tensor-parallel-size": "--rollout-num-gpus-per-engine",
    "--pipeline-parallel-size": "--rollout-num-gpus-per-engine (engines are TP only)",
    "--data-parallel-size": "--rollout-num-gpus (one server per engine)",
    "--max-model-len": "--rollout-max-context-len",
    "--gpu-memory-utilization": "--gpu-memory-utilization",
    "--max-num-seqs": "--max-num-seqs",
    "--max-num-batched-tokens": "--max-num-batched-tokens",
    "--enforce-eager": "--enforce-eager (the simulator models it too)",
    "--async-scheduling": "leave it out: vime keeps vLLM's default (on), --no-async-scheduling turns it off",
    "--no-async-scheduling": "--no-async-scheduling (the simulator models it too)",
    "--seed": "--seed",
    "--enable-sleep-mode": "--offload-rollout (on with --colocate)",
    "--weight-transfer-config": "--update-weight-mode",
    "--served-model-name": "leave it out: vime names the model for its requests",
    "--skip-tokenizer-init": "leave it out: vime sets it when --hf-checkpoint has no tokenizer",
    "--enable-scale-out": "leave it out: vime sets it when the installed vLLM has it",
    "--dtype": "leave it out: the engines serve the checkpoint's dtype (float32 on CPU); --bf16 / --fp16 set the "
               "trainer's",
    "--api-key": "leave it out: vime's client sends no key (the servers listen on loopback or the node address)",
}


def split_vllm_args(argv: Sequence[str], known: Iterable[str]) -> tuple[list[str], list[str]]:
    """(`argv` without the pass-through words, the vLLM words as ``--NAME [VALUE ...]``)."""
    known = set(known)
    rest: list[str] = []
    vllm: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        name, eq, value = word.partition("=")
        if not (name.startswith(PREFIX) and name not in known):
            rest.append(word)
            i += 1
            continue
        vllm.append("--" + name[len(PREFIX):] + (eq + value if eq else ""))
        i += 1
        while i < len(argv) and not argv[i].startswith("--"):
            vllm.append(argv[i])
            i += 1
    return rest, vllm


def check_vllm_args(words: Sequence[str], backend: str) -> None:
    """Refuse pass-through words that are not flags, that vime sets itself, or that nothing would read."""
    flags = [w.partition("=")[0] for w in words if w.startswith("--")]
    if not flags:
        return
    if backend != "real":
        raise ConfigError(f"--vllm-{flags[0][2:]} is passed to `vllm serve`, which only --backend real starts; the "
                          f"simulator does not model vLLM's own flags: drop it, or use --backend real")
    for flag in flags:
        canonical = flag.replace("_", "-")
        if not _NAME.match(canonical):
            raise ConfigError(f"--vllm-{flag[2:]}: {flag!r} is not a vLLM flag name (use --vllm-NAME VALUE, e.g. "
                              f"--vllm-enable-prefix-caching or --vllm-swap-space 4)")
        if canonical in RESERVED:
            instead = RESERVED[canonical]
            raise ConfigError(f"--vllm-{flag[2:]}: vime sets vLLM's {canonical} itself (--backend real); "
                              + (instead if instead.startswith("leave") else f"use {instead}"))
