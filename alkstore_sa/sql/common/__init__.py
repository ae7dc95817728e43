"""Statement pieces every schema version shares: the column expressions, the
shapes of claim, fail and settle that each version fills in, the advisory lock
keys, and the columns in a form any row can be read in."""
