"""What an attempt's tokens cost: the rate card (``runner/data/rate_card.toml``, or the operator's
``--rate-card FILE``) applied to codex's reported usage.

Why here and not in the reducer: the cost is computed once, in the codex phase, and stored in its
marker with the card's sha256; ``--reduce`` then reproduces the compact run byte for byte
whatever card is installed later. A model the card does not name has an unknown cost
(``None``), never a made-up 0.
"""

from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationError

from reducers.models import Frozen
from runner.codex_usage import TokenCounts
from runner.errors import BadInputError, first_problem

RATE_CARD_RESOURCE = "rate_card.toml"
RATE_CARD_MAX_BYTES = 1 << 20
Price = Annotated[float, Field(ge=0, le=100_000, allow_inf_nan=False)]


class ModelRates(Frozen):
    """US dollars per million tokens of one model."""

    input_per_million: Price
    cached_input_per_million: Price
    output_per_million: Price
    reasoning_per_million: Price | None = None
    cache_write_per_million: Price | None = None
    # "openai": cached tokens are part of input_tokens and reasoning part of output_tokens;
    # "disjoint": every count stands alone (Anthropic's cache reads and writes).
    usage: Literal["openai", "disjoint"] = "openai"
    priced_on: str = Field(default="", max_length=40)
    source: str = Field(default="", max_length=300)


class RateCardFile(Frozen):
    version: str = Field(min_length=1, max_length=40)
    models: dict[str, ModelRates]


@dataclass(frozen=True)
class RateCard:
    version: str
    sha256: str
    models: dict[str, ModelRates]

    def rates(self, model: str | None) -> ModelRates | None:
        return self.models.get(model) if model else None


def parse_rate_card(data: bytes, where: str) -> RateCard:
    """Raises: BadInputError naming ``where`` and the first problem."""
    try:
        parsed = RateCardFile.model_validate(tomllib.loads(data.decode("utf-8")))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise BadInputError(f"{where}: not a TOML rate card ({type(e).__name__})") from e
    except ValidationError as e:
        raise BadInputError(f"{where}: {first_problem(e)}") from e
    return RateCard(version=parsed.version, sha256=hashlib.sha256(data).hexdigest(), models=parsed.models)


@lru_cache(maxsize=1)
def shipped_rate_card() -> RateCard:
    data = resources.files("runner.data").joinpath(RATE_CARD_RESOURCE).read_bytes()
    return parse_rate_card(data, RATE_CARD_RESOURCE)


def load_rate_card(path: Path | None) -> RateCard:
    """The operator's card, else the shipped one.

    Raises:
        BadInputError: the file is missing, not a regular file, too large, or not a valid card.
    """
    if path is None:
        return shipped_rate_card()
    try:
        if not path.is_file():
            raise BadInputError(f"--rate-card: {path.name} is not a regular file")
        with path.open("rb") as handle:
            data = handle.read(RATE_CARD_MAX_BYTES + 1)
    except OSError as e:
        raise BadInputError(f"--rate-card: {path.name} cannot be read ({e.strerror or type(e).__name__})") from e
    if len(data) > RATE_CARD_MAX_BYTES:
        raise BadInputError(f"--rate-card: {path.name} is larger than {RATE_CARD_MAX_BYTES} bytes")
    return parse_rate_card(data, f"--rate-card {path.name}")


def cost_usd(usage: TokenCounts, rates: ModelRates) -> float:
    """Dollars, to a millionth of a dollar."""
    reasoning_rate = rates.output_per_million if rates.reasoning_per_million is None else rates.reasoning_per_million
    write_rate = rates.input_per_million if rates.cache_write_per_million is None else rates.cache_write_per_million
    cached, written, reasoning = usage.cached_input_tokens, usage.cache_write_input_tokens, usage.reasoning_output_tokens
    if rates.usage == "openai":
        fresh_input = max(usage.input_tokens - cached - written, 0)
        plain_output = max(usage.output_tokens - reasoning, 0)
    else:
        fresh_input, plain_output = usage.input_tokens, usage.output_tokens
    micro = (
        fresh_input * rates.input_per_million
        + cached * rates.cached_input_per_million
        + written * write_rate
        + plain_output * rates.output_per_million
        + reasoning * reasoning_rate
    )
    return round(micro / 1_000_000, 6)


def price(usage: TokenCounts, model: str | None, card: RateCard) -> float | None:
    """The cost of ``usage`` on ``model``; None when the card does not know the model."""
    rates = card.rates(model)
    return None if rates is None else cost_usd(usage, rates)
