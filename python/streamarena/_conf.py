"""STREAMARENA_CONF strings (key=value,... in the README's keys): the
defaults an integration adds to a user's configuration."""


def named_keys(conf):
    """The keys conf names."""
    return {item.split("=", 1)[0].strip() for item in conf.split(",") if item.strip()}


def with_defaults(conf, defaults):
    """conf with the item of each (key, item) in defaults whose key conf
    does not name, appended: what the user named wins."""
    named = named_keys(conf)
    extra = [item for key, item in defaults if key not in named]
    return ",".join([conf] + extra if conf else extra)
