"""Faithful stand-ins for what cannot exist on this machine (a GPU node's driver, zeusd), always labelled fake."""
