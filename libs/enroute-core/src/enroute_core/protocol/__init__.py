"""Git wire protocol conversations (v0/v1 and v2), sans-IO."""
