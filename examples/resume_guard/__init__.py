"""Where klwatch's resume guard goes in frameworks other than TRL (documentation examples, tested with stand-ins)."""
