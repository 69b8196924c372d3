"""How decoded values are shown: image leaves as 8-bit pixels, pandas frames, the notebook view,
and the optional picture libraries behind them."""
