//! The tiny model's chat template (Iris's own Jinja text, Qwen2-VL style,
//! taking `tools` the way Qwen3-VL's template does).
//!
//! Renders `<|im_start|>role\n...<|im_end|>\n` per message, inserts a default
//! system message when the conversation does not start with one, renders
//! content given as a string or as a list of parts (`image`/`image_url` →
//! `<|vision_start|><|image_pad|><|vision_end|>`, `video`/`video_url` →
//! `<|vision_start|><|video_pad|><|vision_end|>`, `text` → its text), and
//! with `add_generation_prompt` ends with `<|im_start|>assistant\n`.
//!
//! With `tools`, the system turn (the conversation's own, or the default
//! text) is followed by a `# Tools` section listing each tool as JSON
//! between `<tools>` and `</tools>` and asking for calls as
//! `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`. Assistant
//! messages' `tool_calls` are rendered in that form after their content,
//! and consecutive `tool` messages become one user turn of
//! `<tool_response>` blocks. Without tools and tool messages the output is
//! what it always was.

/// The system message used when the conversation has none.
pub const DEFAULT_SYSTEM_MESSAGE: &str = "You are a helpful assistant.";

/// The template source, as stored in `tokenizer_config.json`.
pub const CHAT_TEMPLATE: &str = r#"{#- Iris tiny Qwen2-VL chat template -#}
{%- macro render_content(content) %}
    {%- if content is string %}
        {{- content }}
    {%- elif content %}
        {%- for part in content %}
            {%- if part.type in ['image', 'image_url'] or 'image' in part or 'image_url' in part %}
                {{- '<|vision_start|><|image_pad|><|vision_end|>' }}
            {%- elif part.type in ['video', 'video_url'] or 'video' in part or 'video_url' in part %}
                {{- '<|vision_start|><|video_pad|><|vision_end|>' }}
            {%- elif part.type == 'text' or 'text' in part %}
                {{- part.text }}
            {%- endif %}
        {%- endfor %}
    {%- endif %}
{%- endmacro %}
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages and messages[0].role == 'system' %}
        {{- render_content(messages[0].content) }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- '\n\n# Tools\n\nYou may call the functions below to help with the request. Each one is described by a JSON object between <tools> and </tools>:\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' }}{{- tool | tojson }}
    {%- endfor %}
    {{- '\n</tools>\n\nTo call a function, write a JSON object with its name and arguments between <tool_call> and </tool_call>:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if loop.first and message.role == 'system' and tools %}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or loop.previtem.role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- render_content(message.content) }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or loop.nextitem.role != 'tool' %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- else %}
        {%- if loop.first and message.role != 'system' and not tools %}
            {{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}
        {%- endif %}
        {{- '<|im_start|>' + message.role + '\n' }}
        {{- render_content(message.content) }}
        {%- if message.role == 'assistant' and message.tool_calls %}
            {%- for call in message.tool_calls %}
                {%- if message.content or not loop.first %}
                    {{- '\n' }}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}{{- call.function.name }}{{- '", "arguments": ' }}{{- call.function.arguments | tojson }}{{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}"#;
