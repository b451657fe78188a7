import pytest
from pydantic import ValidationError

from gateway.config import ConfigError, GatewayConfig, PolicyConfig
from gateway.config.policies import Routing
from gateway.testing import gateway_config, tier

BANDS = [{"below": 0.35, "tier": "small"}, {"below": 0.7, "tier": "medium"}, {"tier": "large"}]


@pytest.mark.parametrize(("difficulty", "expected"), [
    (0.0, "small"), (0.3499, "small"), (0.35, "medium"), (0.69, "medium"), (0.7, "large"), (1.0, "large"),
])
def test_bands_cut_the_unit_interval(difficulty: float, expected: str) -> None:
    assert Routing.model_validate({"bands": BANDS}).tier_for(difficulty) == expected


@pytest.mark.parametrize(("bands", "words"), [
    ([{"below": 0.7, "tier": "a"}, {"below": 0.3, "tier": "b"}, {"tier": "c"}], "must increase"),
    ([{"tier": "a"}, {"tier": "b"}], "needs `below`"),
    ([{"below": 0.5, "tier": "a"}], "must reach 1.0"),
    ([{"below": 1.5, "tier": "a"}], "less than or equal to 1"),
    ([], "at least 1"),
])
def test_bad_bands_are_refused(bands: list[dict], words: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Routing.model_validate({"bands": bands})
    assert words in str(caught.value)


def test_a_band_naming_an_unknown_tier_is_refused() -> None:
    base = gateway_config([tier("small", ["http://127.0.0.1:1/v1"])])
    policy = PolicyConfig.model_validate({**base.policy.model_dump(), "routing": {"bands": [{"tier": "huge"}]}})
    with pytest.raises(ConfigError) as caught:
        GatewayConfig.build(base.routes, policy)
    assert "routing.bands[0].tier" in str(caught.value) and "huge" in str(caught.value)
