"""attn_implementation="ck_fmha" in transformers, on the CPU (Triton interpreter): tiny random-weight
Llama / Mistral models built from their configs (no download), fp16, against attn_implementation="sdpa"
with the same weights: logits, loss, gradients, padded batches, sliding windows, greedy generation with
the KV cache.  transformers is optional: the module is skipped without it."""
from __future__ import annotations

import os

if os.environ.get("CK_TEST_GPU") != "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
transformers = pytest.importorskip("transformers")

if os.environ.get("TRITON_INTERPRET") != "1":  # pragma: no cover
    pytest.skip("these tests run the kernels in the Triton interpreter", allow_module_level=True)

from ck_fmha.integrations import transformers as ck_tf  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")]

NAME = ck_tf.register()


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


def pair(kind="llama", **over):
    """The same random weights twice: (sdpa model, ck_fmha model), fp16, eval mode."""
    from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig

    cfg_cls = {"llama": LlamaConfig, "mistral": MistralConfig}[kind]
    cfg = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, max_position_embeddings=64, pad_token_id=0, **over)
    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_config(cfg_cls(**cfg), attn_implementation="sdpa", dtype=torch.float16)
    ck = AutoModelForCausalLM.from_config(cfg_cls(**cfg), attn_implementation=NAME, dtype=torch.float16)
    ck.load_state_dict(ref.state_dict())
    assert ck.config._attn_implementation == NAME
    return ref.eval(), ck.eval()


def ids(b, s, seed):
    return torch.randint(1, 97, (b, s), generator=torch.Generator().manual_seed(seed))


def test_logits_loss_and_gradients_match_sdpa():
    ref, ck = pair()
    x = ids(2, 11, 1)
    out_r, out_c = ref(x, labels=x), ck(x, labels=x)
    assert rel(out_c.logits, out_r.logits) < 5e-3
    assert abs(out_c.loss.item() - out_r.loss.item()) < 2e-3 * abs(out_r.loss.item())
    out_r.loss.backward()
    out_c.loss.backward()
    for (name, pr), (_, pc) in zip(ref.named_parameters(), ck.named_parameters()):
        if pr.grad is not None and pr.grad.norm() > 0:
            assert rel(pc.grad, pr.grad) < 2e-2, name


def test_padded_batch_matches_sdpa_on_real_tokens():
    ref, ck = pair()
    x = ids(3, 9, 2)
    mask = torch.ones_like(x)
    mask[0, :4] = 0           # left padding (generation style)
    mask[2, 6:] = 0           # right padding (training style)
    labels = x.masked_fill(mask == 0, -100)
    out_r = ref(x, attention_mask=mask, labels=labels)
    out_c = ck(x, attention_mask=mask, labels=labels)
    keep = mask.bool()
    assert rel(out_c.logits[keep], out_r.logits[keep]) < 5e-3
    assert abs(out_c.loss.item() - out_r.loss.item()) < 2e-3 * abs(out_r.loss.item())
    out_r.loss.backward()
    out_c.loss.backward()
    gr, gc = ref.model.layers[0].self_attn.q_proj.weight.grad, ck.model.layers[0].self_attn.q_proj.weight.grad
    assert rel(gc, gr) < 2e-2


def test_sliding_window_matches_sdpa():
    ref, ck = pair("mistral", sliding_window=4)
    x = ids(2, 13, 3)
    assert rel(ck(x).logits, ref(x).logits) < 5e-3
    # the window matters here: without it the logits differ
    wide, _ = pair("mistral", sliding_window=None)
    assert rel(wide(x).logits, ref(x).logits) > 1e-2


def test_greedy_generation_with_kv_cache_equals_sdpa():
    ref, ck = pair()
    x = ids(2, 7, 4)
    mask = torch.ones_like(x)
    mask[1, :3] = 0
    kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        g_r, g_c = ref.generate(x, **kw), ck.generate(x, **kw)
    assert g_c.shape == (2, 13)
    assert torch.equal(g_c, g_r)


def test_unsupported_inputs_are_named():
    _, ck = pair()
    attn = ck.model.layers[0].self_attn
    q = torch.randn(1, 4, 5, 16)
    with pytest.raises(ValueError, match="fp16/bf16"):
        ck_tf.attention_forward(attn, q, q[:, :2], q[:, :2], None)
    h = q.half()
    with pytest.raises(NotImplementedError, match="s_aux"):
        ck_tf.attention_forward(attn, h, h[:, :2], h[:, :2], None, s_aux=torch.zeros(4))
    with pytest.raises(ValueError, match="2D padding mask"):
        ck_tf.attention_forward(attn, h, h[:, :2], h[:, :2], torch.ones(1, 1, 5, 5, dtype=torch.bool))


def test_left_padded_batched_generation_logits_match_sdpa_at_every_step():
    ref, ck = pair()
    x = ids(3, 6, 5)
    mask = torch.ones_like(x)
    mask[0, :2] = 0
    mask[2, :4] = 0
    kw = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0, output_logits=True,
              return_dict_in_generate=True)
    with torch.no_grad():
        g_r, g_c = ref.generate(x, **kw), ck.generate(x, **kw)
    assert len(g_c.logits) == len(g_r.logits) == 4
    for step, (lc, lr) in enumerate(zip(g_c.logits, g_r.logits)):
        assert rel(lc, lr) < 5e-3, step
    assert torch.equal(g_c.sequences, g_r.sequences)


def test_any_key_mask_matches_sdpa_and_pads_read_back_nothing():
    """A hole inside a row (not a padding run): the key bias keeps sdpa's meaning; no host sync reads the
    mask (no nonzero / item / bool of a tensor on the attention path)."""
    ref, ck = pair()
    x = ids(2, 8, 6)
    mask = torch.ones_like(x)
    mask[1, 3] = 0
    mask[0, :2] = 0
    keep = mask.bool()
    assert rel(ck(x, attention_mask=mask).logits[keep], ref(x, attention_mask=mask).logits[keep]) < 5e-3
    from torch.overrides import TorchFunctionMode

    seen = []

    class Reads(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    attn = ck.model.layers[0].self_attn
    h = torch.randn(2, 4, 8, 16).half()
    ck_tf.attention_forward(attn, h, h[:, :2], h[:, :2], keep)   # (warm the signature first)
    with Reads():
        out, _ = ck_tf.attention_forward(attn, h, h[:, :2], h[:, :2], keep.clone())
    syncs = {"nonzero", "item", "__bool__", "__int__", "tolist", "__index__", "__float__"} & set(seen)
    assert not syncs, syncs
    assert out.shape == (2, 8, 4, 16) and not out[~keep].any()


@pytest.mark.parametrize("masked", [False, True])
def test_kernels_get_the_layout_the_memory_has(monkeypatch, masked):
    """A decoding step's KV cache ([B, H, S, D] memory) runs as 'bhsd', the projections ([B, S, H, D] memory
    seen as [B, H, S, D]) as 'bshd': what reaches the kernels is dense, never a copy of the cache."""
    seen = []
    real = ck_tf._attention

    def spy(q, k, v, **kw):
        seen.append((kw["layout"], q.is_contiguous(), k.is_contiguous(), v.is_contiguous()))
        return real(q, k, v, **kw)
    monkeypatch.setattr(ck_tf, "_attention", spy)
    mod = type("M", (), {"is_causal": True})()
    b, h, hk, d = 2, 4, 2, 16
    g = torch.Generator().manual_seed(7)
    proj = [torch.randn(b, 5, n, d, generator=g).half().transpose(1, 2) for n in (h, hk, hk)]   # [B, S, H, D]
    cache = [torch.randn(b, hk, 9, d, generator=g).half() for _ in range(2)]                    # [B, H, S, D]
    q1 = torch.randn(b, h, 1, d, generator=g).half()
    mask = torch.ones(b, 9, dtype=torch.long) if masked else None
    mask5 = torch.ones(b, 5, dtype=torch.long) if masked else None
    o_p, _ = ck_tf.attention_forward(mod, *proj, mask5)
    o_c, _ = ck_tf.attention_forward(mod, q1, *cache, mask)
    assert [s[0] for s in seen] == ["bshd", "bhsd"]
    assert all(all(s[1:]) for s in seen), seen
    for (q, k, v), o in (((proj[0], proj[1], proj[2]), o_p), ((q1, cache[0], cache[1]), o_c)):
        kk, vv = (t.double().repeat_interleave(h // hk, 1) for t in (k, v))
        sq, sk = q.shape[2], k.shape[2]
        logits = q.double() @ kk.transpose(-1, -2) * d ** -0.5
        logits = logits.masked_fill(torch.ones(sq, sk).tril(sk - sq).logical_not(), float("-inf"))
        want = (logits.softmax(-1) @ vv).transpose(1, 2)
        assert o.shape == want.shape and rel(o, want) < 5e-3
