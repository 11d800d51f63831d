"""Small models shipped with passkit so that ``passkit run`` works with no arguments."""
