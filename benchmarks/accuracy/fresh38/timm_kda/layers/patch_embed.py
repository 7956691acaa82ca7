""" Image to Patch Embedding using Conv2d
"""
from typing import Optional, Tuple, Union

import torch
from torch import nn as nn
import torch.nn.functional as F


def to_2tuple(x) -> Tuple[int, int]:
    return tuple(x) if isinstance(x, (tuple, list)) else (x, x)


class PatchEmbed(nn.Module):
    """ 2D Image to Patch Embedding, NLC output """

    def __init__(
            self,
            img_size: Optional[Union[int, Tuple[int, int]]] = 16,
            patch_size: int = 8,
            in_chans: int = 3,
            embed_dim: int = 32,
            norm_layer: Optional[type] = None,
            bias: bool = True,
            dynamic_img_pad: bool = False,
            device=None,
            dtype=None,
    ):
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        self.patch_size = to_2tuple(patch_size)
        self.img_size = to_2tuple(img_size)
        self.grid_size = tuple(s // p for s, p in zip(self.img_size, self.patch_size))
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.dynamic_img_pad = dynamic_img_pad
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size, bias=bias, **dd)
        self.norm = norm_layer(embed_dim, **dd) if norm_layer else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.dynamic_img_pad:
            ph, pw = ((p - s % p) % p for s, p in zip(x.shape[-2:], self.patch_size))
            x = F.pad(x, (0, pw, 0, ph))
        x = self.proj(x.to(self.proj.weight.dtype))
        x = x.flatten(2).transpose(1, 2)  # NCHW -> NLC
        return self.norm(x)
