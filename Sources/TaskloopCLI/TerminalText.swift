/// Text as a terminal shows it: in columns, without control characters. Task names and
/// progress messages come from programs and API clients, so what reaches the terminal is
/// cleaned first: an escape sequence in a message must not move the cursor or recolour the
/// screen, and a line feed must not break a line-per-change log.
enum TerminalText {
    /// `text` with line breaks and tabs as spaces, other control characters (C0, DEL, C1) as
    /// `?`, and bidirectional overrides dropped (they would reorder the rest of the line).
    static func sanitized(_ text: String) -> String {
        guard text.unicodeScalars.contains(where: needsCleaning) else { return text }
        var scalars = String.UnicodeScalarView()
        for scalar in text.unicodeScalars {
            switch scalar.value {
            case 0x09, 0x0A, 0x0D: scalars.append(" ")
            case 0x00...0x1F, 0x7F...0x9F: scalars.append("?")
            case 0x202A...0x202E, 0x2066...0x2069: continue
            default: scalars.append(scalar)
            }
        }
        return String(scalars)
    }

    private static func needsCleaning(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.value {
        case 0x00...0x1F, 0x7F...0x9F, 0x202A...0x202E, 0x2066...0x2069: true
        default: false
        }
    }

    /// Columns a character takes: 0 for combining and format characters, 2 for East Asian
    /// wide and full-width ones and emoji, else 1. An approximation of wcwidth(3) that needs
    /// no locale; a cluster (a letter and its accents, an emoji sequence) takes at most 2.
    static func columns(of character: Character) -> Int {
        min(2, character.unicodeScalars.reduce(0) { $0 + columns(of: $1) })
    }

    static func columns(of text: String) -> Int {
        text.reduce(0) { $0 + columns(of: $1) }
    }

    private static func columns(of scalar: Unicode.Scalar) -> Int {
        switch scalar.properties.generalCategory {
        case .nonspacingMark, .enclosingMark, .format: return 0
        default: break
        }
        switch scalar.value {
        case 0x1100...0x115F, 0x2E80...0x303E, 0x3041...0x33FF, 0x3400...0x4DBF, 0x4E00...0x9FFF, 0xA000...0xA4CF,
             0xAC00...0xD7A3, 0xF900...0xFAFF, 0xFE30...0xFE4F, 0xFF00...0xFF60, 0xFFE0...0xFFE6, 0x1F300...0x1F64F,
             0x1F900...0x1F9FF, 0x20000...0x2FFFD, 0x30000...0x3FFFD:
            return 2
        default:
            return 1
        }
    }

    /// At most `width` columns of `text`, ending in `…` when something was cut.
    static func fitted(_ text: String, to width: Int) -> String {
        guard width > 0 else { return "" }
        guard columns(of: text) > width else { return text }
        var kept = ""
        var used = 0
        for character in text {
            let taken = columns(of: character)
            guard used + taken <= width - 1 else { break }
            kept.append(character)
            used += taken
        }
        return kept + "…"
    }

    /// `text` fitted to `width` columns and padded with spaces to exactly that many.
    static func padded(_ text: String, to width: Int) -> String {
        let fitted = fitted(text, to: width)
        return fitted + String(repeating: " ", count: max(0, width - columns(of: fitted)))
    }

    /// `text` right-aligned in `width` columns (numbers).
    static func rightAligned(_ text: String, to width: Int) -> String {
        String(repeating: " ", count: max(0, width - columns(of: text))) + text
    }
}
