"""The model family as composable parts (docs/science.md §6, §8; docs/design.md).

* parts (`parts`): schemes (`schemes`, with the norms of `norms`), weightings (`weighting`),
  positional encodings (`positional`), heads, QK-norm and projection biases
  (`heads`), the feed-forward term
  (`feedforward`), the interaction strength (`strength`); each registered in `PARTS` with
  its name, text form and record;
* the attention sublayer (`attention.SelfAttention`) and its exact Jacobian (`jacobian`);
* blocks (`block.Block`, and `block.Attention`, one block from flat keyword arguments) and
  stacks of blocks (`stack.Stack`), the two kinds of `Model`;
* text forms of the options for the CLI and sweeps (`text`).
"""

from attnflow.family.attention import SelfAttention
from attnflow.family.block import FORMS, Attention, Block
from attnflow.family.feedforward import ACTIVATIONS, MLP
from attnflow.family.heads import ProjectionBias, QKNorm
from attnflow.family.norms import Direction, LayerNorm, RMSNorm
from attnflow.family.parts import KINDS, PARTS, Part, part_from_record, parts_table, register
from attnflow.family.positional import ALiBi, Encoding, RoPE, ScoreBias
from attnflow.family.schemes import NGPT, SCHEMES, Flat, Peri, Post, Pre, Scheme, make_scheme
from attnflow.family.stack import Model, Stack, model_from_record, segments
from attnflow.family.strength import Strength
from attnflow.family.weighting import Weighting

__all__ = ["ACTIVATIONS", "FORMS", "KINDS", "MLP", "NGPT", "PARTS", "SCHEMES", "ALiBi",
           "Attention", "Block", "Direction", "Encoding", "Flat", "LayerNorm", "Model", "Part",
           "Peri", "Post", "Pre", "ProjectionBias", "QKNorm", "RMSNorm", "RoPE", "Scheme",
           "ScoreBias",
           "SelfAttention", "Stack", "Strength", "Weighting", "make_scheme", "model_from_record",
           "part_from_record", "parts_table", "register", "segments"]
