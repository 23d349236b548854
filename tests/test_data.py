"Data pieces that need a package registry or are awkward in a notebook."
import pytest
import torch
from neuronfrontier.data import gpt2_tokenizer, token_bytes_of, bos_id, PackedLoader, find_shards, load_tokenizer


def test_gpt2_tokenizer_offline_from_whisper_sdist(tmp_path):
    enc = gpt2_tokenizer(tmp_path)  # pip-downloads the openai-whisper sdist once (a package registry), no hub access
    assert enc.n_vocab == 50257 and bos_id(enc) == 50256
    # GPT-2's well-known ids
    assert enc.encode_ordinary("Hello world") == [15496, 995]
    tb = token_bytes_of(enc)
    assert tb[50256] == 0 and tb[15496] == 5
    assert (tmp_path / "gpt2.tiktoken").exists()


def test_loader_rank_shards_are_disjoint_and_cover(pydocs):
    tr, _ = find_shards(pydocs)
    enc, _ = load_tokenizer(pydocs / "tokenizer")
    rows = {}
    for rank in (0, 1):
        dl = PackedLoader(tr, enc, batch_size=4, seq_len=256, rank=rank, world_size=2, seed=0)
        x, _ = next(dl)
        assert (x[:, 0] == bos_id(enc)).all()
        rows[rank] = {tuple(r[:32].tolist()) for r in x}
    assert not (rows[0] & rows[1])


def test_packing_utilisation_at_cpu_tiny_shape(pydocs):
    tr, _ = find_shards(pydocs)
    enc, _ = load_tokenizer(pydocs / "tokenizer")
    dl = PackedLoader(tr, enc, batch_size=16, seq_len=256, seed=0)
    for _ in range(30): next(dl)
    assert 0.5 < dl.utilisation <= 1.0
