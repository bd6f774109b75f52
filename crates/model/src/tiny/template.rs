//! The tiny model's chat template (Iris's own Jinja text, Qwen2-VL style).
//!
//! Renders `<|im_start|>role\n...<|im_end|>\n` per message, inserts a default
//! system message when the conversation does not start with one, renders
//! content given as a string or as a list of parts (`image`/`image_url` →
//! `<|vision_start|><|image_pad|><|vision_end|>`, `video`/`video_url` →
//! `<|vision_start|><|video_pad|><|vision_end|>`, `text` → its text), and
//! with `add_generation_prompt` ends with `<|im_start|>assistant\n`.

/// The system message used when the conversation has none.
pub const DEFAULT_SYSTEM_MESSAGE: &str = "You are a helpful assistant.";

/// The template source, as stored in `tokenizer_config.json`.
pub const CHAT_TEMPLATE: &str = r#"{#- Iris tiny Qwen2-VL chat template -#}
{%- for message in messages %}
    {%- if loop.first and message.role != 'system' %}
        {{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
    {{- '<|im_start|>' + message.role + '\n' }}
    {%- if message.content is string %}
        {{- message.content }}
    {%- elif message.content %}
        {%- for part in message.content %}
            {%- if part.type in ['image', 'image_url'] or 'image' in part or 'image_url' in part %}
                {{- '<|vision_start|><|image_pad|><|vision_end|>' }}
            {%- elif part.type in ['video', 'video_url'] or 'video' in part or 'video_url' in part %}
                {{- '<|vision_start|><|video_pad|><|vision_end|>' }}
            {%- elif part.type == 'text' or 'text' in part %}
                {{- part.text }}
            {%- endif %}
        {%- endfor %}
    {%- endif %}
    {{- '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}"#;
