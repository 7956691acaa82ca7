"""as_fp32_gate_cache: the loader-side conversion."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from replaylint.guards import GateCacheDtypeError, GateCacheDtypeWarning, as_fp32_gate_cache  # noqa: E402


def test_float32_is_returned_as_is_without_a_warning(fresh_warnings: None) -> None:
    g = torch.zeros(2, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert as_fp32_gate_cache(g) is g


def test_low_precision_is_copied_to_float32_with_one_warning_per_dtype(
    fresh_warnings: None,
) -> None:
    stored = torch.tensor([0.5, -1.25], dtype=torch.bfloat16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = as_fp32_gate_cache(stored)
        as_fp32_gate_cache(stored)
        as_fp32_gate_cache(stored.half())
    assert loaded.dtype is torch.float32
    assert loaded.tolist() == [0.5, -1.25]
    assert loaded.data_ptr() != stored.data_ptr()
    assert [w.category for w in caught] == [GateCacheDtypeWarning] * 2
    assert caught[0].filename == __file__
    text = str(caught[0].message)
    assert (
        "as_fp32_gate_cache(): the gate cache is torch.bfloat16; returning a torch.float32 copy"
        in text
    )
    assert "already rounded" in text
    assert "replaylint --fix" in text


@pytest.mark.parametrize("value", [None, [0.0], 1.0], ids=["None", "list", "float"])
def test_non_tensors_are_refused(value: Any) -> None:
    with pytest.raises(
        GateCacheDtypeError, match=r"must be a torch\.Tensor of dtype torch\.float32"
    ):
        as_fp32_gate_cache(value)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.complex64])
def test_non_floating_dtypes_are_refused(dtype: Any) -> None:
    with pytest.raises(GateCacheDtypeError, match=r"is not a floating-point dtype"):
        as_fp32_gate_cache(torch.zeros(2, dtype=dtype))


def test_meta_zero_size_and_sparse_inputs(fresh_warnings: None) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        meta = as_fp32_gate_cache(torch.empty(2, device="meta", dtype=torch.float16))
        assert meta.device.type == "meta"
        assert meta.dtype is torch.float32
        assert as_fp32_gate_cache(torch.zeros(0, 4, dtype=torch.bfloat16)).shape == (0, 4)
        sparse = as_fp32_gate_cache(torch.ones(2, 2, dtype=torch.bfloat16).to_sparse())
        assert sparse.layout == torch.sparse_coo
        assert sparse.dtype is torch.float32


def test_compiles_without_graph_breaks(fresh_warnings: None) -> None:
    def load(stored: Any) -> Any:
        return as_fp32_gate_cache(stored) * 2

    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        explanation = torch._dynamo.explain(load)(torch.ones(2, dtype=torch.bfloat16))
    assert explanation.graph_break_count == 0
    assert [w.category for w in caught if w.category is GateCacheDtypeWarning] == [
        GateCacheDtypeWarning
    ]
    torch._dynamo.reset()


def test_compiles_with_dynamic_shapes_and_checks_float64_in_a_graph_break(
    fresh_warnings: None,
) -> None:
    def load(stored: Any) -> Any:
        return as_fp32_gate_cache(stored) * 2

    torch._dynamo.reset()
    compiled = torch.compile(load, dynamic=True, backend="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for size in (2, 3):
            assert compiled(torch.ones(size, dtype=torch.bfloat16)).tolist() == [2.0] * size
        assert compiled(torch.ones(2, dtype=torch.float64)).tolist() == [2.0, 2.0]
        with pytest.raises(GateCacheDtypeError, match=r"outside the range of torch\.float32"):
            compiled(torch.tensor([1e300, 0.0], dtype=torch.float64))
    torch._dynamo.reset()
