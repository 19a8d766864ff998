"""A tokenizer for the tiny config-only model, built at test time (no download).

Dynamo's frontend serves a model only once its card carries a tokenizer, which the leader's
Dynamo sidecar takes from SGLang's ``GetModelInfo`` (the launch's ``--tokenizer-path``). The
tiny model ships a config only, so this builds one with the ``tokenizers`` library: a
byte-level BPE trained on a fixed corpus up to exactly the model's vocabulary size (every id
the dummy weights can sample decodes), with a chat template. The same files every time.
SGLang keeps ``--skip-tokenizer-init`` (requests carry token ids); only the card needs it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def training_corpus() -> list[str]:
    numbers = [" ".join(map(str, range(start, start + 100))) for start in range(0, 20000, 100)]
    return numbers + ["the quick brown fox jumps over the lazy dog hello world user assistant"] * 50


def build(model: Path, out: Path) -> Path:
    """``tokenizer.json`` and ``tokenizer_config.json`` for ``model``'s vocabulary in ``out``,
    beside a copy of its ``config.json`` (Dynamo's sidecar reads the model's config from the
    tokenizer's directory, and fails the node without it); built once per directory; ``out``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if (out / "tokenizer_config.json").exists():
        return out
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=SPECIAL_TOKENS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(training_corpus(), trainer)
    if tokenizer.get_vocab_size() > vocab:
        raise AssertionError(f"tokenizer has {tokenizer.get_vocab_size()} tokens > {vocab}")
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(model / "config.json", out / "config.json")
    tokenizer.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<unk>",
        "model_max_length": 2048,
        "add_bos_token": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out
