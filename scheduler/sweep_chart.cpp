// sweep.png: bars per variant (table order, left to right). Top panel: samples/s; bottom:
// peak memory of the role whose plan changes most across the grid (named in the panel),
// planned (grey) beside measured RSS (blue); red marks a variant that failed or would not
// fit. Values are printed above the bars in a 3x5 font.
// The PNG is written by hand (stored deflate blocks, CRC-32, Adler-32): no image library.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <fstream>
#include <iomanip>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/errors.h"
#include "scheduler/sweep.h"

namespace rlhf {
namespace {

struct Rgb {
  uint8_t r, g, b;
};
constexpr Rgb kWhite{255, 255, 255}, kAxis{60, 60, 60}, kThroughput{46, 139, 87},
    kPlanned{170, 170, 170}, kMeasured{52, 101, 164}, kBad{204, 40, 40};

class Canvas {
 public:
  Canvas(int w, int h) : w_(w), h_(h), px_(static_cast<size_t>(w) * h, kWhite) {}
  void fill(int x0, int y0, int x1, int y1, Rgb c) {
    for (int y = std::max(0, y0); y < std::min(h_, y1); ++y)
      for (int x = std::max(0, x0); x < std::min(w_, x1); ++x)
        px_[static_cast<size_t>(y) * w_ + x] = c;
  }
  // 3x5 glyphs (scale 2) with the baseline at y: digits, capitals, 'k' and . / _ - = : ,;
  // other characters advance as a space.
  void text(int x, int y, const std::string& s, Rgb c) {
    static const std::map<char, const char*> kGlyphs = {
        {'0', "111101101101111"}, {'1', "010110010010111"}, {'2', "111001111100111"},
        {'3', "111001111001111"}, {'4', "101101111001001"}, {'5', "111100111001111"},
        {'6', "111100111101111"}, {'7', "111001001001001"}, {'8', "111101111101111"},
        {'9', "111101111001111"}, {'.', "000000000000010"}, {'/', "001001010100100"},
        {'k', "100101110101101"}, {'M', "101111111101101"}, {'G', "111100101101111"},
        {'A', "010101111101101"}, {'C', "011100100100011"}, {'T', "111010010010010"},
        {'O', "010101101101010"}, {'R', "110101110101101"}, {'I', "111010010010111"},
        {'E', "111100110100111"}, {'F', "111100110100100"}, {'L', "100100100100111"},
        {'U', "101101101101111"}, {'W', "101101111111101"}, {'D', "110101101101110"},
        {'S', "011100010001110"}, {'P', "110101110100100"}, {'K', "101101110101101"},
        {'N', "110101101101101"}, {'B', "110101110101110"}, {'H', "101101111101101"},
        {'J', "001001001101010"}, {'Q', "010101101110011"}, {'V', "101101101101010"},
        {'X', "101101010101101"}, {'Y', "101101010010010"}, {'Z', "111001010100111"},
        {'_', "000000000000111"}, {'-', "000000111000000"}, {'=', "000111000111000"},
        {':', "000010000010000"}, {',', "000000000010100"}};
    for (char ch : s) {
      auto it = kGlyphs.find(ch);
      // Letters without a glyph of their own (all but 'k') are drawn as capitals.
      if (it == kGlyphs.end())
        it = kGlyphs.find(static_cast<char>(std::toupper(static_cast<unsigned char>(ch))));
      if (it != kGlyphs.end())
        for (int i = 0; i < 15; ++i)
          if (it->second[i] == '1')
            fill(x + (i % 3) * 2, y - 10 + (i / 3) * 2, x + (i % 3) * 2 + 2,
                 y - 10 + (i / 3) * 2 + 2, c);
      x += 8;
    }
  }
  std::string png() const;

 private:
  int w_, h_;
  std::vector<Rgb> px_;
};

uint32_t crc32(const std::string& data) {
  static uint32_t table[256];
  static bool ready = false;
  if (!ready) {
    for (uint32_t n = 0; n < 256; ++n) {
      uint32_t c = n;
      for (int k = 0; k < 8; ++k) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      table[n] = c;
    }
    ready = true;
  }
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : data) c = table[(c ^ b) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

void put32(std::string& s, uint32_t v) {
  for (int i = 3; i >= 0; --i) s += static_cast<char>((v >> (8 * i)) & 0xFF);
}

void chunk(std::string& out, const char* type, const std::string& data) {
  put32(out, static_cast<uint32_t>(data.size()));
  const std::string body = std::string(type, 4) + data;
  out += body;
  put32(out, crc32(body));
}

std::string Canvas::png() const {
  std::string raw;  // scanlines, each with filter byte 0
  for (int y = 0; y < h_; ++y) {
    raw += '\0';
    for (int x = 0; x < w_; ++x) {
      const Rgb& p = px_[static_cast<size_t>(y) * w_ + x];
      raw += static_cast<char>(p.r);
      raw += static_cast<char>(p.g);
      raw += static_cast<char>(p.b);
    }
  }
  // zlib (RFC 1950) around stored deflate blocks (RFC 1951, BTYPE 00), then Adler-32.
  std::string z = "\x78\x01";
  for (size_t pos = 0; pos < raw.size() || pos == 0; pos += 65535) {
    const size_t n = std::min<size_t>(65535, raw.size() - pos);
    z += static_cast<char>(pos + n >= raw.size() ? 1 : 0);
    z += static_cast<char>(n & 0xFF);
    z += static_cast<char>(n >> 8);
    z += static_cast<char>(~n & 0xFF);
    z += static_cast<char>((~n >> 8) & 0xFF);
    z.append(raw, pos, n);
    if (raw.empty()) break;
  }
  uint32_t a = 1, b = 0;
  for (unsigned char c : raw) {
    a = (a + c) % 65521;
    b = (b + a) % 65521;
  }
  put32(z, (b << 16) | a);
  std::string out = "\x89PNG\r\n\x1a\n";
  std::string ihdr;
  put32(ihdr, static_cast<uint32_t>(w_));
  put32(ihdr, static_cast<uint32_t>(h_));
  ihdr += std::string("\x08\x02\x00\x00\x00", 5);  // 8-bit RGB, deflate, no filter, no interlace
  chunk(out, "IHDR", ihdr);
  chunk(out, "IDAT", z);
  chunk(out, "IEND", "");
  return out;
}

std::string short_number(double v) {
  std::ostringstream o;
  if (v >= 1e9)
    o << std::fixed << std::setprecision(1) << v / (1ll << 30) << "G";
  else if (v >= 1e6)
    o << std::fixed << std::setprecision(0) << v / (1 << 20) << "M";
  else if (v >= 1e4)
    o << std::fixed << std::setprecision(0) << v / 1e3 << "k";
  else
    o << std::fixed << std::setprecision(v < 10 ? 2 : 1) << v;
  return o.str();
}

// The role whose planned total varies most across the variants (the largest on a tie).
std::string swept_role(const std::vector<VariantResult>& results) {
  std::map<std::string, std::pair<int64_t, int64_t>> range;  // role -> (min, max)
  for (const auto& r : results)
    for (const auto& [role, f] : r.memory) {
      if (f.planned_total <= 0) continue;
      auto it = range.find(role);
      if (it == range.end())
        range[role] = {f.planned_total, f.planned_total};
      else
        it->second = {std::min(it->second.first, f.planned_total),
                      std::max(it->second.second, f.planned_total)};
    }
  std::string best;
  std::pair<int64_t, int64_t> key{-1, -1};
  for (const auto& [role, mm] : range) {
    const std::pair<int64_t, int64_t> k{mm.second - mm.first, mm.second};
    if (k > key) {
      key = k;
      best = role;
    }
  }
  return best;
}

}  // namespace

void write_sweep_chart(const std::vector<VariantResult>& results, const std::string& path) {
  const int n = std::max<int>(1, static_cast<int>(results.size()));
  const int slot = 90, left = 20, width = std::max(420, left * 2 + n * slot), panel = 180, gap = 40,
            height = 2 * panel + 3 * gap + 40;
  Canvas c(width, height);
  const std::string role = swept_role(results);
  // 0 where nothing was planned or measured (-1 in the figures): no bar and no label.
  auto planned = [&role](const VariantResult& r) {
    return r.memory.count(role)
               ? std::max(0.0, static_cast<double>(r.memory.at(role).planned_total))
               : 0.0;
  };
  auto measured = [&role](const VariantResult& r) {
    return r.memory.count(role) ? std::max(0.0, static_cast<double>(r.memory.at(role).measured_rss))
                                : 0.0;
  };
  double max_speed = 0, max_mem = 0;
  for (const auto& r : results) {
    max_speed = std::max(max_speed, r.samples_per_s);
    max_mem = std::max({max_mem, planned(r), measured(r)});
  }
  const int top_base = gap + panel, bottom_base = 2 * gap + 2 * panel + gap / 2;
  c.text(left, 16, "SAMPLES/S", kAxis);
  std::string label = "PEAK " + role;
  for (char& ch : label) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  c.text(left, top_base + 30, label, kAxis);
  c.fill(left + 8 * static_cast<int>(label.size()) + 16, top_base + 20,
         left + 8 * static_cast<int>(label.size()) + 26, top_base + 30, kPlanned);
  c.text(left + 8 * static_cast<int>(label.size()) + 30, top_base + 30, "PLANNED", kAxis);
  c.fill(left + 8 * static_cast<int>(label.size()) + 94, top_base + 20,
         left + 8 * static_cast<int>(label.size()) + 104, top_base + 30, kMeasured);
  c.text(left + 8 * static_cast<int>(label.size()) + 108, top_base + 30, "RSS", kAxis);
  // Under each bar its swept values ("2/16"); the last line names the keys in that order.
  if (!results.empty()) {
    const auto& first = results.front();
    std::string keys;
    const size_t axes = first.values.size();
    for (size_t a = 0; a < axes && a < first.overrides.size(); ++a) {
      const std::string& o = first.overrides[first.overrides.size() - axes + a];
      std::string key = o.substr(0, o.find('='));
      key = key.substr(key.rfind('.') == std::string::npos ? 0 : key.rfind('.') + 1);
      keys += (a ? " / " : "") + key;
    }
    c.text(left, height - 10, "X: " + keys, kAxis);
  }
  for (int i = 0; i < static_cast<int>(results.size()); ++i) {
    std::string values;
    for (size_t a = 0; a < results[i].values.size(); ++a)
      values += (a ? "/" : "") + results[i].values[a];
    c.text(left + i * slot + 10, bottom_base + 18, values, kAxis);
  }
  c.fill(left, top_base, width - left, top_base + 2, kAxis);
  c.fill(left, bottom_base, width - left, bottom_base + 2, kAxis);
  for (int i = 0; i < static_cast<int>(results.size()); ++i) {
    const VariantResult& r = results[i];
    const int x = left + i * slot + 10;
    const bool bad = r.status != VariantStatus::kOk && r.status != VariantStatus::kFits;
    if (max_speed > 0 && r.samples_per_s > 0) {
      const int h = static_cast<int>(panel * r.samples_per_s / max_speed);
      c.fill(x, top_base - h, x + 60, top_base, kThroughput);
      c.text(x, top_base - h - 4, short_number(r.samples_per_s), kAxis);
    }
    if (bad) c.fill(x, top_base + 4, x + 70, top_base + 10, kBad);
    if (max_mem > 0 && (planned(r) > 0 || measured(r) > 0)) {
      const int hp = static_cast<int>((panel - 20) * planned(r) / max_mem);
      c.fill(x, bottom_base - hp, x + 30, bottom_base, bad ? kBad : kPlanned);
      if (measured(r) > 0) {
        const int hm = static_cast<int>((panel - 20) * measured(r) / max_mem);
        c.fill(x + 32, bottom_base - hm, x + 62, bottom_base, kMeasured);
      }
      c.text(x,
             bottom_base - std::max(hp, static_cast<int>((panel - 20) * measured(r) / max_mem)) - 4,
             short_number(planned(r)), kAxis);
    }
  }
  std::ofstream out(path, std::ios::binary);
  out << c.png();
  out.close();
  if (!out) throw RuntimeError("cannot write " + path);
}

}  // namespace rlhf
