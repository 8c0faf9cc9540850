"""A zoo of tiny random models of transformers' text architectures, built from their own configs.

``CAPTURED`` must be captured exactly (softmax of the captured scores equals eager attention,
the outputs unchanged, every layer analysable), ``REFUSED`` refused in one line. Each entry
returns (config, the transformers class that builds it). Tiny: hidden 64, 2 layers, 4 heads,
64 positions, minilm's vocabulary; windowed variants use windows of 4 keys, shorter than the
12-token inputs of the test (tests/test_zoo.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import transformers
import transformers as T

import attnlens
from attnlens.errors import UnsupportedModel
from attnlens.models.capture import Capture
from tiny_models import save_with_minilm_tokenizer

SENTENCES = ["In the beginning God created the heaven and the earth.", "And the earth was without form."]
N = 12  # tokens per input: longer than the zoo's windows of 4 keys

V, H, L, NH, I, P = 30522, 64, 2, 4, 128, 64  # noqa: E741 (I: intermediate size)
IDS = dict(pad_token_id=0, bos_token_id=101, eos_token_id=102)
W = 4  # window, shorter than the 12-token test length


def bert_like(cls, **kw):
    sizes = dict(vocab_size=V, hidden_size=H, num_hidden_layers=L, num_attention_heads=NH, intermediate_size=I)
    return cls(**{**sizes, "max_position_embeddings": P, "pad_token_id": 0, **kw})


def roberta_like(cls, **kw):  # position ids start after the padding index
    return bert_like(cls, max_position_embeddings=P + 2, bos_token_id=101, eos_token_id=102, **kw)


def llama_like(cls, **kw):
    base = dict(
        vocab_size=V,
        hidden_size=H,
        intermediate_size=I,
        num_hidden_layers=L,
        num_attention_heads=NH,
        max_position_embeddings=P,
        **IDS,
    )
    base.update(kw)
    return cls(**base)


SW2 = ["sliding_attention", "full_attention"]

Zoo = dict[str, Callable[[], tuple[T.PretrainedConfig, str]]]

# fmt: off
CAPTURED: Zoo = {
    "bert": lambda: (bert_like(T.BertConfig), "BertModel"),
    "roberta": lambda: (roberta_like(T.RobertaConfig), "RobertaModel"),
    "distilbert": lambda: (T.DistilBertConfig(vocab_size=V, dim=H, n_layers=L, n_heads=NH, hidden_dim=I,
                                              max_position_embeddings=P, pad_token_id=0), "DistilBertModel"),
    "electra": lambda: (bert_like(T.ElectraConfig, embedding_size=32), "ElectraModel"),
    "albert": lambda: (bert_like(T.AlbertConfig, embedding_size=32), "AlbertModel"),
    "mobilebert": lambda: (T.MobileBertConfig(vocab_size=V, hidden_size=H, num_hidden_layers=L, num_attention_heads=NH,
                                              intermediate_size=I, max_position_embeddings=P, pad_token_id=0,
                                              embedding_size=32, intra_bottleneck_size=32, true_hidden_size=32,
                                              num_feedforward_networks=1), "MobileBertModel"),
    "esm": lambda: (T.EsmConfig(vocab_size=V, hidden_size=H, num_hidden_layers=L, num_attention_heads=NH,
                                intermediate_size=I, max_position_embeddings=P, pad_token_id=0, mask_token_id=103,
                                position_embedding_type="rotary"), "EsmModel"),
    "deberta": lambda: (bert_like(T.DebertaConfig, relative_attention=True, pos_att_type=["c2p", "p2c"],
                                  max_relative_positions=P), "DebertaModel"),
    "deberta-v2": lambda: (bert_like(T.DebertaV2Config, relative_attention=True, pos_att_type=["c2p", "p2c"],
                                     max_relative_positions=P, position_buckets=16), "DebertaV2Model"),
    "modernbert (local 4, global every 2)": lambda: (T.ModernBertConfig(
        vocab_size=V, hidden_size=H, intermediate_size=I, num_hidden_layers=L, num_attention_heads=NH,
        max_position_embeddings=P, local_attention=W, global_attn_every_n_layers=2,
        pad_token_id=0, bos_token_id=101, eos_token_id=102, cls_token_id=101, sep_token_id=102), "ModernBertModel"),
    "gpt2": lambda: (T.GPT2Config(vocab_size=V, n_embd=H, n_layer=L, n_head=NH, n_inner=I, n_positions=P,
                                  bos_token_id=101, eos_token_id=102), "GPT2LMHeadModel"),
    "gpt_bigcode (MQA)": lambda: (T.GPTBigCodeConfig(vocab_size=V, n_embd=H, n_layer=L, n_head=NH, n_inner=I,
                                                     n_positions=P, multi_query=True, bos_token_id=101,
                                                     eos_token_id=102), "GPTBigCodeForCausalLM"),
    "gpt_neox": lambda: (llama_like(T.GPTNeoXConfig), "GPTNeoXForCausalLM"),
    "gptj": lambda: (T.GPTJConfig(vocab_size=V, n_embd=H, n_layer=L, n_head=NH, n_inner=I, n_positions=P,
                                  rotary_dim=8, bos_token_id=101, eos_token_id=102), "GPTJForCausalLM"),
    "opt": lambda: (T.OPTConfig(vocab_size=V, hidden_size=H, num_hidden_layers=L, ffn_dim=I, num_attention_heads=NH,
                                max_position_embeddings=P, word_embed_proj_dim=H, **IDS), "OPTForCausalLM"),
    "biogpt": lambda: (bert_like(T.BioGptConfig, bos_token_id=101, eos_token_id=102), "BioGptForCausalLM"),
    "falcon (alibi=False)": lambda: (llama_like(T.FalconConfig, alibi=False, intermediate_size=None,
                                                ffn_hidden_size=I), "FalconForCausalLM"),
    "falcon (alibi=True)": lambda: (llama_like(T.FalconConfig, alibi=True, intermediate_size=None,
                                               ffn_hidden_size=I), "FalconForCausalLM"),
    "falcon (new arch, GQA)": lambda: (llama_like(T.FalconConfig, alibi=False, new_decoder_architecture=True,
                                                  num_kv_heads=2, intermediate_size=None, ffn_hidden_size=I),
                                       "FalconForCausalLM"),
    "llama (GQA 4/2)": lambda: (llama_like(T.LlamaConfig, num_key_value_heads=2), "LlamaForCausalLM"),
    "mistral (sliding 4)": lambda: (llama_like(T.MistralConfig, num_key_value_heads=2, sliding_window=W),
                                    "MistralForCausalLM"),
    "qwen2 (sliding 4 from layer 1)": lambda: (llama_like(T.Qwen2Config, num_key_value_heads=2, use_sliding_window=True,
                                                          sliding_window=W, max_window_layers=1), "Qwen2ForCausalLM"),
    "qwen3": lambda: (llama_like(T.Qwen3Config, num_key_value_heads=2, head_dim=16), "Qwen3ForCausalLM"),
    "phi3 (sliding 4)": lambda: (llama_like(T.Phi3Config, num_key_value_heads=2, sliding_window=W),
                                 "Phi3ForCausalLM"),
    "gemma": lambda: (llama_like(T.GemmaConfig, num_key_value_heads=2, head_dim=16), "GemmaForCausalLM"),
    "gemma2 (sliding 4 + softcap)": lambda: (llama_like(T.Gemma2Config, num_key_value_heads=2, head_dim=16,
                                                        sliding_window=W, attn_logit_softcapping=50.0,
                                                        final_logit_softcapping=30.0, query_pre_attn_scalar=16,
                                                        layer_types=SW2), "Gemma2ForCausalLM"),
    "gemma3_text (sliding 4)": lambda: (llama_like(T.Gemma3TextConfig, num_key_value_heads=2, head_dim=16,
                                                   sliding_window=W, query_pre_attn_scalar=16, layer_types=SW2),
                                        "Gemma3ForCausalLM"),
    "cohere2 (sliding 4)": lambda: (llama_like(T.Cohere2Config, num_key_value_heads=2, sliding_window=W,
                                               layer_types=SW2), "Cohere2ForCausalLM"),
    "olmo2": lambda: (llama_like(T.Olmo2Config), "Olmo2ForCausalLM"),
    "granite": lambda: (llama_like(T.GraniteConfig, num_key_value_heads=2, attention_multiplier=0.3),
                        "GraniteForCausalLM"),
    "deepseek_v3 (MLA)": lambda: (llama_like(T.DeepseekV3Config, num_key_value_heads=4, kv_lora_rank=16,
                                             q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                                             n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                             first_k_dense_replace=1, n_group=1, topk_group=1),
                                  "DeepseekV3ForCausalLM"),
    "llama4_text (chunked 4)": lambda: (llama_like(T.Llama4TextConfig, num_key_value_heads=2, head_dim=16,
                                                   intermediate_size_mlp=I, num_local_experts=2,
                                                   attention_chunk_size=W, no_rope_layers=[1, 0],
                                                   moe_layers=[], interleave_moe_layer_step=0),
                                        "Llama4ForCausalLM"),
    "smollm3 (NoPE layer)": lambda: (llama_like(T.SmolLM3Config, num_key_value_heads=2, no_rope_layers=[1, 0]),
                                     "SmolLM3ForCausalLM"),
    "t5 encoder": lambda: (T.T5Config(vocab_size=V, d_model=H, d_kv=16, d_ff=I, num_layers=L, num_heads=NH,
                                      pad_token_id=0, eos_token_id=102, decoder_start_token_id=0),
                           "T5EncoderModel"),
    "t5": lambda: (T.T5Config(vocab_size=V, d_model=H, d_kv=16, d_ff=I, num_layers=L, num_heads=NH,
                              pad_token_id=0, eos_token_id=102, decoder_start_token_id=0), "T5Model"),
    "umt5 encoder": lambda: (T.UMT5Config(vocab_size=V, d_model=H, d_kv=16, d_ff=I, num_layers=L, num_heads=NH,
                                          pad_token_id=0, eos_token_id=102, decoder_start_token_id=0),
                             "UMT5EncoderModel"),
    "bart": lambda: (T.BartConfig(vocab_size=V, d_model=H, encoder_layers=L, decoder_layers=L,
                                  encoder_attention_heads=NH, decoder_attention_heads=NH, encoder_ffn_dim=I,
                                  decoder_ffn_dim=I, max_position_embeddings=P, decoder_start_token_id=102, **IDS),
                     "BartModel"),
    "pegasus": lambda: (T.PegasusConfig(vocab_size=V, d_model=H, encoder_layers=L, decoder_layers=L,
                                        encoder_attention_heads=NH, decoder_attention_heads=NH, encoder_ffn_dim=I,
                                        decoder_ffn_dim=I, max_position_embeddings=P, decoder_start_token_id=0,
                                        **IDS), "PegasusModel"),
}

REFUSED: Zoo = {
    "gemma4_text (per-layer head sizes)": lambda: (llama_like(T.Gemma4TextConfig, num_key_value_heads=2, head_dim=16, sliding_window=W,
                                                              layer_types=SW2, hidden_size_per_layer_input=16,
                                                              vocab_size_per_layer_input=V), "Gemma4ForCausalLM"),
    "diffllama (two calls per layer)": lambda: (llama_like(T.DiffLlamaConfig, head_dim=16), "DiffLlamaForCausalLM"),
    "mpnet": lambda: (bert_like(T.MPNetConfig, relative_attention_num_buckets=32), "MPNetModel"),
    "xlnet": lambda: (T.XLNetConfig(vocab_size=V, d_model=H, n_layer=L, n_head=NH, d_inner=I, pad_token_id=0,
                                    bos_token_id=101, eos_token_id=102), "XLNetModel"),
    "longformer (window 4)": lambda: (roberta_like(T.LongformerConfig, attention_window=W), "LongformerModel"),
    "bigbird (block_sparse)": lambda: (bert_like(T.BigBirdConfig, attention_type="block_sparse", block_size=2,
                                                 num_random_blocks=1), "BigBirdModel"),
    "gpt_neo (local window 4)": lambda: (T.GPTNeoConfig(vocab_size=V, hidden_size=H, num_layers=L, num_heads=NH,
                                                        intermediate_size=I, max_position_embeddings=P,
                                                        attention_types=[[["global", "local"], 1]], window_size=W,
                                                        bos_token_id=101, eos_token_id=102), "GPTNeoForCausalLM"),
    "bloom (alibi)": lambda: (T.BloomConfig(vocab_size=V, hidden_size=H, n_layer=L, n_head=NH, **IDS),
                              "BloomForCausalLM"),
    "mpt": lambda: (T.MptConfig(vocab_size=V, d_model=H, n_heads=NH, n_layers=L, expansion_ratio=2, max_seq_len=P,
                                pad_token_id=0, bos_token_id=101, eos_token_id=102), "MptForCausalLM"),
    "gpt_oss (sinks)": lambda: (llama_like(T.GptOssConfig, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                                           num_experts_per_tok=2, sliding_window=W), "GptOssForCausalLM"),
    "jamba (hybrid)": lambda: (llama_like(T.JambaConfig, num_key_value_heads=2, attn_layer_period=2,
                                          attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1,
                                          num_experts=2, num_experts_per_tok=1, use_mamba_kernels=False,
                                          mamba_d_state=8), "JambaForCausalLM"),
    "longt5 encoder (local radius 2)": lambda: (T.LongT5Config(vocab_size=V, d_model=H, d_kv=16, d_ff=I, num_layers=L,
                                                               num_heads=NH, local_radius=2,
                                                               encoder_attention_type="local", pad_token_id=0,
                                                               eos_token_id=102, decoder_start_token_id=0),
                                                "LongT5EncoderModel"),
}
# fmt: on


def build(directory: Path, minilm, make) -> tuple[Path, str]:
    """The zoo entry ``make`` as a saved model directory (seeded weights, minilm's tokenizer), and its class."""
    config, class_name = make()
    torch.manual_seed(0)
    model = getattr(transformers, class_name)(config)
    return save_with_minilm_tokenizer(directory / "model", model, minilm), class_name


def measure(directory: Path, minilm, architecture: str) -> tuple[attnlens.LoadedModel, dict[str, float]]:
    """Capture a captured entry on two sentences (one padded) and compare with transformers' eager attention.

    ``weights``: max |softmax of the captured scores over valid keys − eager ``output_attentions``| on
    the valid positions of real tokens (float64 softmax against eager's float32 weights); ``outputs``:
    max |final hidden state − eager's| on real tokens; ``layers`` captured and ``eager_layers``."""
    path, class_name = build(directory, minilm, CAPTURED[architecture])
    model = attnlens.load_model(str(path))
    batch = minilm.tokenizer(SENTENCES, padding="max_length", max_length=N, truncation=True, return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    with torch.no_grad(), Capture() as capture:
        hidden = model.forward(ids, attention_mask=mask, output_hidden_states=True).hidden_states[-1]
    eager_model = getattr(transformers, class_name).from_pretrained(str(path), attn_implementation="eager").eval()
    if type(model.model) is not type(eager_model):  # attnlens reads an encoder-decoder's encoder alone
        eager_model = eager_model.get_encoder()
    with torch.no_grad():
        eager = eager_model(input_ids=ids, attention_mask=mask, output_attentions=True, output_hidden_states=True)
    tokens = mask.bool()
    weights = 0.0
    for layer, scores in capture.scores.items():
        valid = capture.valid[layer]
        softmax = scores.double().masked_fill(~valid[:, None], float("-inf")).softmax(-1)
        seen = (valid & tokens[:, :, None])[:, None].expand_as(softmax)  # padding tokens' rows are no one's business
        weights = max(weights, float((softmax - eager.attentions[layer].double()).abs()[seen].max()))
    outputs = float((hidden[tokens] - eager.hidden_states[-1][tokens]).abs().max())
    return model, {"layers": len(capture.scores), "eager_layers": len(eager.attentions), "weights": weights, "outputs": outputs}


def refusal(directory: Path, minilm, architecture: str) -> str | None:
    """The one-line message ``load_model`` refuses a refused entry with (None if it loads)."""
    path, _ = build(directory, minilm, REFUSED[architecture])
    try:
        attnlens.load_model(str(path))
    except UnsupportedModel as error:
        return str(error)
    return None


# ---------------------------------------------------------------------------- the report on every captured entry

# The smallest sizes that exercise every stage of `attnlens report` (tests/test_zoo_report*.py): blocks of 16
# tokens, longer than the windows of 4 keys, a few blocks and examples.
_TASK = dict(task_train=32, task_eval=24)


def tiny_report():
    from attnlens.report.presets import QUICK

    return QUICK.stages(
        eigen=dict(seq_len=16, num_seqs=24),
        reconstruct=dict(seq_len=16, num_seqs=24, ks=(1, 4), task_ks=(4,), **_TASK),
        importance=dict(seq_len=16, num_seqs=4, **_TASK),
        dam=dict(seq_len=16, steps=4, stop_window=2, check_window=2, train_seqs=4, eval_seqs=4, **_TASK),
        plan=dict(seq_len=16, fit_seqs=8, curve_seqs=2, select_seqs=4, eval_seqs=4, ks=(4,), widths=(2,), **_TASK),
        sinks=dict(seq_len=16, num_seqs=8, min_keys=8),
    )


# One captured entry of each geometry (bidirectional, causal with grouped queries, a windowed encoder, a windowed
# decoder with soft-capping): their reports render every figure (tests/test_zoo_report.py says why only they).
DRAWN = {"bert", "llama (GQA 4/2)", "modernbert (local 4, global every 2)", "gemma2 (sliding 4 + softcap)"}
DECODERS = [name for name, make in CAPTURED.items() if make()[1].endswith(("ForCausalLM", "LMHeadModel"))]
ENCODERS = [name for name in CAPTURED if name not in DECODERS]


def blank_figure(figure, stem: Path, formats: tuple[str, ...] = ("png",)) -> list[Path]:
    """``save_figure`` without rendering: the built figure is closed and a one-pixel PNG stands for it."""
    import matplotlib.pyplot as plt
    from PIL import Image

    plt.close(figure)
    path = Path(stem).with_suffix(".png")
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (1, 1), "white").save(path)
    return [path]


def check_report(architecture: str, directory: Path, minilm, monkeypatch, capsys) -> None:
    """Run ``attnlens report --quick`` (at :func:`tiny_report`'s sizes) on the entry, and read what it wrote."""
    import json

    from attnlens.report.presets import PRESETS, STAGES
    from tiny_models import run_cli

    path, _ = build(directory, minilm, CAPTURED[architecture])
    monkeypatch.setitem(PRESETS, ("probe", "quick"), tiny_report())
    if architecture not in DRAWN:
        monkeypatch.setattr("attnlens.io.result_figures.save_figure", blank_figure)
    out = directory / "report"
    code, _, err = run_cli(capsys, "report", "--quick", "--model", str(path), "--out", str(out), "--no-progress")
    assert code == 0, err
    assert (out / "report.html").is_file()
    report = attnlens.load_result(out)
    decoder = architecture in DECODERS  # a decoder's report measures its sinks; an encoder's does not
    stages = {stage for stage in STAGES if decoder or stage != "sinks"}
    assert set(report.meta["results"]) >= {"eigen", "overlap", *stages} and ("sinks" in report.meta["results"]) == decoder
    sink_claims = report.claims["claim"].str.contains("attention sink|heavy-hitter")
    assert sink_claims.sum() == (2 if decoder else 0), "the decoder's claims on a decoder's page only"
    assert report.claims["claim"].str.contains("recent window").sum() == int(decoder)
    assert report.meta["results"]["eigen"] == "eigen-model", "named from the model's directory"
    spectra = report.result("eigen").table.query("level == 'layer'")
    assert len(spectra) == report.meta["model"]["num_layers"] and (spectra.rows > 0).all()
    assert len(report.claims) and report.claims["verdict"].str.len().gt(0).all()
    figures = [figure for name in report.meta["results"].values() for figure in (out / name / "figures").glob("*.png")]
    assert len(figures) >= 10 and all(figure.stat().st_size > 0 for figure in figures)
    assert set(json.loads((out / "result.json").read_text())["timings_s"]) >= {"eigen", *stages, "figures"}
