#pragma once

namespace olmosft {
extern const char* const kOlmo3ThinkTemplate;  // open-instruct olmo_thinker (Olmo 3 Think SFT)
}  // namespace olmosft
