"""The GPT chapter's package: one small decoder-only transformer specified once, four
implementations, and the corpus it learns from.  Framework-neutral here (NumPy only):

- ``spec``: :class:`GPTConfig`, :func:`gpt_spec` (names and shapes), :func:`gpt_init` (the
  canonical float64 draw), :func:`param_count`, :func:`flops_per_token`, and a NumPy
  forward pass every framework is held to (:func:`reference_logits`, :func:`reference_loss`);
- ``corpus``: Jane Austen's six novels from Debian's ``r-cran-janeaustenr``, verified
  (:func:`load_corpus`, :func:`obtain_corpus`), :class:`CharTokenizer`, the held-out novel,
  reproducible windows (:func:`sample_windows`, :class:`WindowSampler`, :func:`eval_windows`);
- ``ngram``: character n-gram entropies in nats (:func:`ngram_entropy`,
  :func:`ngram_cross_entropy`, :func:`entropy_table`).

The implementations are imported by name, each importing only its framework:
``from d2lmini.gpt import torch as gpt`` (``GPT``, ``canonical_init``, ``loss``), likewise
``jax`` (``gpt``, ``canonical_init``, ``loss``), ``paddle`` and ``mxnet``.
"""
from __future__ import annotations

from .corpus import (CORPUS_CHARS, NOVELS, TEXT_SHA256, AustenCorpus, CharTokenizer, WindowSampler,
                     corpus_path, eval_windows, load_corpus, load_text, obtain_corpus,
                     sample_windows, text_from_deb)
from .ngram import entropy_table, ngram_cross_entropy, ngram_entropy
from .spec import (GPT2_SMALL, GPTConfig, check_tokens, flops_per_token, gpt_init, gpt_spec,
                   param_count, reference_logits, reference_loss)

__all__ = ["GPTConfig", "GPT2_SMALL", "gpt_spec", "gpt_init", "param_count", "flops_per_token",
           "check_tokens", "reference_logits", "reference_loss", "CORPUS_CHARS", "NOVELS", "TEXT_SHA256",
           "AustenCorpus", "CharTokenizer", "WindowSampler", "corpus_path", "eval_windows",
           "load_corpus", "load_text", "obtain_corpus", "sample_windows", "text_from_deb",
           "ngram_entropy", "ngram_cross_entropy", "entropy_table", "profile_config"]


def profile_config(profile=None, bench: bool = False) -> GPTConfig:
    """The :class:`GPTConfig` of a profile's GPT (default: :func:`d2lmini.get_profile`'s):
    its trained model (vocabulary: the corpus's 81 characters), or with ``bench=True`` its
    benchmarked shape (GPT-2 small under the gpu profile)."""
    from ..config import get_profile
    hp = (profile or get_profile()).gpt
    size = hp.bench if bench else hp.model
    vocab = None if size.vocab is not None else len(CORPUS_CHARS)
    return GPTConfig.from_size(size, vocab)

