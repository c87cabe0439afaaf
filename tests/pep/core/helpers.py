"""Small builders shared by the PEP core tests."""
from pdp.results import AttributeAssignment, Obligation

XS = "http://www.w3.org/2001/XMLSchema#"


def ob(
    obligation_id: str, *pairs: tuple[str, str], prefix: str = "pCloud:obligation:"
) -> Obligation:
    return Obligation(obligation_id, tuple(
        AttributeAssignment(prefix + name, XS + ("integer" if value.isdigit() else "string"), value)
        for name, value in pairs))


def figure2(filter_text: str = "rainrate > 5") -> tuple[Obligation, ...]:
    """The paper's Figure 2 obligations, plus (as policies/weather/nea-weather-policy.xml) xsg's
    pre-window filter attribute `rainrate`, without which Figure 4(a)'s filter is refused."""
    return (
        ob("exacml:obligation:stream-filter", ("stream-filter-condition-id", filter_text)),
        ob("exacml:obligation:stream-map", ("stream-map-attribute-id", "samplingtime"),
           ("stream-map-attribute-id", "rainrate"), ("stream-map-attribute-id", "windspeed")),
        ob("exacml:obligation:stream-window", ("stream-window-step-id", "2"),
           ("stream-window-size-id", "5"), ("stream-window-type-id", "tuple"),
           ("stream-window-attr-id", "samplingtime:lastval"),
           ("stream-window-attr-id", "rainrate:avg"), ("stream-window-attr-id", "windspeed:max"),
           ("stream-window-filter-attribute-id", "rainrate")),
    )


FIGURE_4A = b"""<UserQuery>
   <Stream name="weather" />
   <Filter>
      <FilterCondition>
      RainRate > 50
      </FilterCondition>
   </Filter>
   <Map>
      <Attribute>RainRate</Attribute>
   </Map>
   <Aggregation>
      <WindowType>tuple</WindowType>
      <WindowSize>10</WindowSize>
      <WindowStep>2</WindowStep>
      <Attribute>avg(RainRate)</Attribute>
   </Aggregation>
</UserQuery>"""

# The figure exactly as printed, with its unclosed <WindowSize> and <WindowStep>.
FIGURE_4A_AS_PRINTED = FIGURE_4A.replace(b"10</WindowSize>", b"10<WindowSize>").replace(
    b"2</WindowStep>", b"2<WindowStep>")
