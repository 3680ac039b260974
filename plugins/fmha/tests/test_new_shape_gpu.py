"""A new size of a known signature on the GPU (issues #26 / #27): decode loops whose key length grows by one
per call are right against float64 at every step and reuse their selection family's pick; a padding mask's key
bias replays with each call's own bias; the transformers integration's padded generation gives sdpa's logits.
Run with ``CK_TEST_GPU=1 pytest -m gpu plugins/fmha/tests/test_new_shape_gpu.py``."""
import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _ref(q, k, v, causal, bias=None):   # [B, S, H, D] in, float64, GQA by repetition, bottom-right causal
    q, k, v = (x.double().transpose(1, 2) for x in (q, k, v))
    k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    if bias is not None:
        s = s + bias.double()
    if causal:
        sq, sk = s.shape[-2:]
        s = s.masked_fill(~torch.ones(sq, sk, dtype=torch.bool, device=s.device).tril(sk - sq), float("-inf"))
    return (torch.softmax(s, -1).nan_to_num(0.0) @ v).transpose(1, 2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_decode_loop_is_right_at_every_new_length_and_every_replay(dtype):
    import ck_fmha.flash_attn as fa
    from ck_core import api as core

    g = torch.Generator(device="cuda").manual_seed(11)
    q = torch.randn(4, 1, 16, 128, device="cuda", dtype=dtype, generator=g)
    before = None
    for s in range(150, 190):
        k = torch.randn(4, 4, s, 128, device="cuda", dtype=dtype, generator=g).transpose(1, 2)
        v = torch.randn(4, 4, s, 128, device="cuda", dtype=dtype, generator=g).transpose(1, 2)
        ref = _ref(q, k, v, True)
        assert _rel(fa.flash_attn_func(q, k, v, causal=True), ref) < 1e-2, s       # a new signature
        assert _rel(fa.flash_attn_func(q, k, v, causal=True), ref) < 1e-2, s       # its replay
        if before is None:
            before = sum(d.selections for d in core._DISPATCHERS.values())
    assert sum(d.selections for d in core._DISPATCHERS.values()) - before <= 6   # 39 new lengths, ~3 buckets


def test_a_padding_bias_replays_with_each_calls_bias():
    import ck_fmha

    g = torch.Generator(device="cuda").manual_seed(12)
    b, s = 3, 77
    q = torch.randn(b, 8, 1, 64, device="cuda", dtype=torch.float16, generator=g)
    k, v = (torch.randn(b, 2, s, 64, device="cuda", dtype=torch.float16, generator=g) for _ in range(2))
    for trial in range(4):
        keep = torch.rand(b, s, device="cuda", generator=g) > 0.3
        keep[:, -1] = True
        bias = torch.zeros(b, 1, 1, s, device="cuda", dtype=torch.float16)
        bias = bias.masked_fill(~keep[:, None, None, :], float("-inf")).expand(b, 1, 1, s)
        o = ck_fmha.attention(q, k, v, causal="bottom_right", align="bottom_right", bias=bias)
        ref = _ref(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), True, bias).transpose(1, 2)
        assert _rel(o, ref) < 1e-2, trial


def test_left_padded_generation_gives_sdpas_logits():
    transformers = pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM, LlamaConfig

    from ck_fmha.integrations import transformers as ck_tf

    name = ck_tf.register()
    cfg = dict(vocab_size=97, hidden_size=256, intermediate_size=256, num_hidden_layers=2, num_attention_heads=8,
               num_key_value_heads=2, head_dim=32, max_position_embeddings=128, pad_token_id=0)
    torch.manual_seed(0)
    with torch.device("cuda"):
        ref = AutoModelForCausalLM.from_config(LlamaConfig(**cfg), attn_implementation="sdpa", dtype=torch.float16)
        ck = AutoModelForCausalLM.from_config(LlamaConfig(**cfg), attn_implementation=name, dtype=torch.float16)
    ck.load_state_dict(ref.state_dict())
    x = torch.randint(1, 97, (4, 19), device="cuda", generator=torch.Generator(device="cuda").manual_seed(5))
    mask = torch.ones_like(x)
    mask[1, :5] = 0
    mask[3, :11] = 0
    kw = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0, output_logits=True,
              return_dict_in_generate=True)
    with torch.no_grad():
        g_r, g_c = ref.eval().generate(x, **kw), ck.eval().generate(x, **kw)
    for step, (lc, lr) in enumerate(zip(g_c.logits, g_r.logits)):
        assert _rel(lc, lr) < 1e-2, step
    assert (g_c.sequences == g_r.sequences).float().mean().item() > 0.9


def test_right_and_left_padded_training_step_gives_sdpas_loss_and_gradients():
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM, LlamaConfig

    from ck_fmha.integrations import transformers as ck_tf

    name = ck_tf.register()
    cfg = dict(vocab_size=97, hidden_size=256, intermediate_size=256, num_hidden_layers=2, num_attention_heads=8,
               num_key_value_heads=2, head_dim=32, max_position_embeddings=128, pad_token_id=0)
    torch.manual_seed(0)
    with torch.device("cuda"):
        ref = AutoModelForCausalLM.from_config(LlamaConfig(**cfg), attn_implementation="sdpa", dtype=torch.bfloat16)
        ck = AutoModelForCausalLM.from_config(LlamaConfig(**cfg), attn_implementation=name, dtype=torch.bfloat16)
    ck.load_state_dict(ref.state_dict())
    x = torch.randint(1, 97, (3, 40), device="cuda", generator=torch.Generator(device="cuda").manual_seed(6))
    mask = torch.ones_like(x)
    mask[0, :9] = 0      # left padding
    mask[2, 27:] = 0     # right padding
    labels = x.masked_fill(mask == 0, -100)
    out_r, out_c = ref(x, attention_mask=mask, labels=labels), ck(x, attention_mask=mask, labels=labels)
    keep = mask.bool()
    assert _rel(out_c.logits[keep], out_r.logits[keep]) < 2e-2
    assert abs(out_c.loss.item() - out_r.loss.item()) < 2e-2 * abs(out_r.loss.item())
    out_r.loss.backward()
    out_c.loss.backward()
    for (pname, pr), (_, pc) in zip(ref.named_parameters(), ck.named_parameters()):
        if pr.grad is not None and pr.grad.norm() > 0:
            assert _rel(pc.grad, pr.grad) < 5e-2, pname
