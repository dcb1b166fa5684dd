"""The papers attnflow reproduces or checks (docs/science.md §6).

`REFERENCES` maps an arXiv id to its `Reference`. Which recipe checks which paper is the
recipe's own word (its ``PAPERS``; the seed paper for the paper suite's recipes:
`attnflow.experiments.references_of`); the report and the documentation cite from here.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Reference", "REFERENCES", "SEED"]


@dataclass(frozen=True)
class Reference:
    """One paper: authors (None where not recorded here: see its arXiv page), title, venue."""

    arxiv: str
    title: str
    authors: tuple[str, ...] | None
    venue: str = ""

    @property
    def url(self) -> str:
        return f"https://arxiv.org/abs/{self.arxiv}"

    def text(self) -> str:
        """One line: 'Authors. Title. Venue. arXiv:id.'"""
        who = (", ".join(self.authors) + ". ") if self.authors else ""
        venue = f" {self.venue}." if self.venue else ""
        return f"{who}{self.title}.{venue} arXiv:{self.arxiv}."


SEED = "2411.04990"

REFERENCES: dict[str, Reference] = {r.arxiv: r for r in (
    Reference(SEED, "Clustering in Causal Attention Masking",
              ("N. Karagodin", "Y. Polyanskiy", "P. Rigollet"), "NeurIPS 2024"),
    Reference("2305.05465", "The emergence of clusters in self-attention dynamics",
              ("B. Geshkovski", "C. Letrouit", "Y. Polyanskiy", "P. Rigollet"), "NeurIPS 2023"),
    Reference("2312.10794", "A mathematical perspective on Transformers",
              ("B. Geshkovski", "C. Letrouit", "Y. Polyanskiy", "P. Rigollet")),
    Reference("2512.01868", "The Mean-Field Dynamics of Transformers", ("P. Rigollet",)),
    Reference("2510.22026", "Normalization in Attention Dynamics",
              ("N. Karagodin", "S. Ge", "Y. Polyanskiy", "P. Rigollet"), "NeurIPS 2025"),
    Reference("2510.05554", "Critical attention scaling in long-context transformers",
              ("S. Chen", "Z. Lin", "Y. Polyanskiy", "P. Rigollet"), "ICLR 2026"),
    Reference("2605.08505", "Scaling Limits of Long-Context Transformers",
              ("G. Bruno", "P. Rigollet", "S. Chen", "Y. Polyanskiy", "Z. Lin")),
    Reference("2410.23228", "Emergence of meta-stable clustering in mean-field transformer "
              "models", ("G. Bruno", "F. Pasqualotto", "A. Agazzi"), "ICLR 2025"),
    Reference("2410.06833", "Dynamic metastability in the self-attention model",
              ("B. Geshkovski", "H. Koubbi", "Y. Polyanskiy", "P. Rigollet")),
    Reference("2601.21942", "Clustering in Deep Stochastic Transformers", None),
    Reference("2501.18322", "A Unified Perspective on the Dynamics of Deep Transformers",
              ("V. Castin", "P. Ablin", "J. A. Carrillo", "G. Peyré")),
    Reference("2607.24502", "Self-Attention Dynamics with Rotary Position Embeddings", None),
    Reference("2605.09213", "Kinetic theory for Transformers and the lost-in-the-middle "
              "phenomenon", None),
    Reference("2507.22857", "Synchronization of mean-field models on the circle",
              ("Y. Polyanskiy", "P. Rigollet", "A. Yao")),
    Reference("2410.10781", "When Attention Sink Emerges in Language Models: An Empirical View",
              ("X. Gu", "T. Pang", "C. Du", "Q. Liu", "F. Zhang", "C. Du", "Y. Wang",
               "M. Lin"), "ICLR 2025"),
    Reference("1909.00512", "How Contextual are Contextualized Word Representations? "
              "Comparing the Geometry of BERT, ELMo, and GPT-2 Embeddings", ("K. Ethayarajh",),
              "EMNLP 2019"),
    # arXiv title; ICML 2025 (PMLR) title "Consensus is all you get: the role of attention in
    # transformers"
    Reference("2412.02682", "The Asymptotic Behavior of Attention in Transformers",
              ("Á. Rodríguez Abella", "J. P. Silvestre", "P. Tabuada"), "ICML 2025"),
    Reference("2606.05140", "Phase transitions for the noisy transformer model in arbitrary "
              "dimension", ("K. Mun", "M. Rosenzweig")),
    Reference("2604.16288", "Phase transitions in Doi-Onsager, Noisy Transformer, and other "
              "multimodal models", ("K. Mun", "M. Rosenzweig")),
    Reference("2510.20094", "On the Structure of Stationary Solutions to McKean-Vlasov "
              "Equations with Applications to Noisy Transformers",
              ("K. Balasubramanian", "S. Banerjee", "P. Rigollet")),
    Reference("2508.09628", "Attention's forward pass and Frank-Wolfe",
              ("A. Alcalde", "B. Geshkovski", "D. Ruiz-Balet")),
    Reference("2407.01602", "Clustering in pure-attention hardmax transformers and its role "
              "in sentiment analysis", ("A. Alcalde", "G. Fantuzzi", "E. Zuazua"),
              "SIAM J. Math. Data Sci. 2025"),
)}
