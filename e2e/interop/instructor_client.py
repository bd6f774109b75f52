"""instructor in JSON_SCHEMA mode against the gateway's chat completions:
a pydantic model extracted twice from the same question (temperature 0).

Run by e2e/tests/test_agent_clients.py with the interpreter of the
instructor venv (.ci/instructor/requirements.txt: instructor pins an older
``openai`` than the e2e venv). Arguments: the gateway's ``/v1`` URL and the
model name. Prints one JSON line: the versions, the model's fields, the
``response_format`` type instructor sent and the finish reason; exits
non-zero when instructor cannot validate the answer (no retries).
"""

import json
import sys

import instructor
import openai
from pydantic import BaseModel


class Weather(BaseModel):
    city: str
    degrees: int
    sunny: bool


def main() -> None:
    base_url, model = sys.argv[1], sys.argv[2]
    raw = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
    client = instructor.from_openai(raw, mode=instructor.Mode.JSON_SCHEMA)
    sent = []
    client.on("completion:kwargs", lambda *args, **kwargs: sent.append(kwargs))
    answers = []
    for _ in range(2):
        weather, completion = client.chat.completions.create_with_completion(
            model=model,
            response_model=Weather,
            max_retries=0,
            max_tokens=600,
            temperature=0,
            messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        )
        answers.append((weather, completion))
    (weather, completion), (again, _) = answers
    formats = [kwargs.get("response_format", {}).get("type") for kwargs in sent]
    print(json.dumps({
        "instructor": instructor.__version__,
        "openai": openai.__version__,
        "weather": weather.model_dump(),
        "again": again.model_dump(),
        "response_format": formats[0] if formats and len(set(formats)) == 1 else formats,
        "finish_reason": completion.choices[0].finish_reason,
    }))


if __name__ == "__main__":
    main()
