"""tiercache.proto — placeholder package; see DESIGN.md (built in a later issue)."""
