"""Fake model APIs on loopback that the tests start, so real agent CLIs run offline."""
