"""Typed settings for the app: the instance catalog, frozen settings and the context reader."""
