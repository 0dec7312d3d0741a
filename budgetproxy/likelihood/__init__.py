"""The likelihood view: two policies' logged actions scored under a reference model."""

from budgetproxy.likelihood.run import LikelihoodOptions, run_likelihood
from budgetproxy.likelihood.scoring import LikelihoodInputError

__all__ = ["LikelihoodInputError", "LikelihoodOptions", "run_likelihood"]
