"""Write the JSON Schema of every exported message to schemas/json/ (python -m schemas.export)."""

from __future__ import annotations

import json
from pathlib import Path

from schemas import EXPORTED_MODELS

JSON_DIR = Path(__file__).parent / "json"


def rendered_schemas() -> dict[str, str]:
    """File name -> JSON Schema text, exactly as the files in ``schemas/json/`` should read."""
    return {
        f"{model.__name__}.json": json.dumps(model.model_json_schema(), indent=2, sort_keys=True)
        + "\n"
        for model in EXPORTED_MODELS
    }


def main() -> None:
    """Rewrite ``schemas/json/`` from the models."""
    JSON_DIR.mkdir(exist_ok=True)
    for stale in JSON_DIR.glob("*.json"):
        stale.unlink()
    for name, text in rendered_schemas().items():
        (JSON_DIR / name).write_text(text)
    print(f"wrote {len(EXPORTED_MODELS)} schemas to {JSON_DIR}")


if __name__ == "__main__":
    main()
