"""Vision models from timm and torchvision, built with random weights (``pretrained=False``,
``weights=None``): lcnet_050, densenet121, alexnet and a small detector.

Both packages are optional and are imported inside the builders: where they cannot be imported (a
CPU-only torch with a mismatched torchvision build, for example) the workload reports
``model_fail_to_load`` with the import error.

The detector takes a list of images and returns a list of dicts (boxes, scores, labels) whose lengths
depend on the data: its tags say ``dynamic``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from suites.workloads.common import generator, import_optional, place, randn, seed_weights
from suites.workloads.registry import Tag, workload


def image_batch(size: Any, device: Any, dtype: torch.dtype) -> tuple[torch.Tensor]:
    return (randn((size["batch"], 3, size["height"], size["width"]), device, dtype, generator()),)


def _images(batch: int, side: int) -> dict[str, int]:
    return {"batch": batch, "height": side, "width": side}


def _timm(name: str) -> Any:
    def build(size: Any, device: Any, dtype: torch.dtype) -> tuple[nn.Module, tuple[Any, ...]]:
        timm = import_optional("timm")
        seed_weights()
        model = timm.create_model(name, pretrained=False)
        return place(model, device, dtype), image_batch(size, device, dtype)

    build.__doc__ = f"timm {name} with random weights."
    return build


workload(
    "lcnet_050",
    sizes={"smoke": _images(1, 64), "standard": _images(32, 224), "full": _images(256, 224)},
    tags=(Tag.VISION, Tag.LAUNCH_BOUND, Tag.VENDOR),
    requires=("timm",),
    code=(image_batch,),
)(_timm("lcnet_050"))

workload(
    "densenet121",
    sizes={"smoke": _images(1, 32), "standard": _images(8, 224), "full": _images(64, 224)},
    tags=(Tag.VISION, Tag.LAUNCH_BOUND, Tag.VENDOR),
    requires=("timm",),
    code=(image_batch,),
)(_timm("densenet121"))


@workload(
    "alexnet",
    sizes={"smoke": _images(1, 64), "standard": _images(16, 224), "full": _images(128, 224)},
    tags=(Tag.VISION, Tag.VENDOR),
    requires=("torchvision",),
    code=(image_batch,),
)
def build_alexnet(size: Any, device: Any, dtype: torch.dtype) -> tuple[nn.Module, tuple[Any, ...]]:
    """torchvision alexnet with random weights."""
    models = import_optional("torchvision.models")
    seed_weights()
    return place(models.alexnet(weights=None), device, dtype), image_batch(size, device, dtype)


@workload(
    "fasterrcnn_mobilenet_v3_large_320_fpn",
    sizes={
        "smoke": {"batch": 1, "side": 96, "min_size": 96, "max_size": 96},
        "standard": {"batch": 2, "side": 320, "min_size": 320, "max_size": 640},
        "full": {"batch": 8, "side": 320, "min_size": 320, "max_size": 640},
    },
    tags=(Tag.VISION, Tag.DYNAMIC, Tag.CGCT, Tag.GRAPH_BREAK),
    requires=("torchvision",),
)
def build_fasterrcnn(size: Any, device: Any, dtype: torch.dtype) -> tuple[nn.Module, tuple[Any, ...]]:
    """torchvision Faster R-CNN, MobileNetV3-Large 320 FPN backbone, random weights."""
    detection = import_optional("torchvision.models.detection")
    seed_weights()
    model = detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, min_size=size["min_size"], max_size=size["max_size"]
    )
    gen = generator()
    images = [
        torch.rand(3, size["side"], size["side"], generator=gen).to(device, dtype)
        for _ in range(size["batch"])
    ]
    return place(model, device, dtype), (images,)
