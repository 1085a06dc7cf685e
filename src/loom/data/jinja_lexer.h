// Splits chat-template source into tokens the way jinja2's lexer does with transformers'
// settings: text between tags (with trim_blocks, lstrip_blocks and the `-`/`+` whitespace
// controls applied), `{{ }}` and `{% %}` delimiters, and the expression tokens inside them.
// Comments are dropped here. Newlines are normalised to "\n" and one trailing newline is removed.
#pragma once
#include <string>
#include <vector>

namespace loom::data::jinja {

enum class TokenKind { kText, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEnd };

struct Token {
  TokenKind kind;
  std::string text;  // text, name, operator, or the decoded string literal / number spelling
  int line;
};

// Throws "[chat-template] NAME:LINE: ..." on unterminated tags, comments or strings and on
// characters that cannot start a token.
std::vector<Token> tokenize(const std::string& source, const std::string& name);

}  // namespace loom::data::jinja
