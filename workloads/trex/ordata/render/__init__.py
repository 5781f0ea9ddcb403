"""Natural-language rendering of instances: domain templates, three styles, long and concise forms."""

from trex.ordata.render.numbers import NumberLog, fmt_num
from trex.ordata.render.text import STYLES, Rendered, render

__all__ = ["STYLES", "NumberLog", "Rendered", "fmt_num", "render"]
