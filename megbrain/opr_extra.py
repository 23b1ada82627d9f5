"""``opr_extra``: operators defined outside the generated operator set (none yet)."""
